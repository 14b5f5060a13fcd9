//! Builder methods for the `#[non_exhaustive]` configuration structs, generated from one list
//! of fields so the methods and the fields cannot drift apart.

/// `name(self, value) -> Self` for each `name: Type`.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty),+ $(,)?) => {
        $(
            $(#[$doc])*
            #[must_use]
            pub fn $name(mut self, $name: $ty) -> Self {
                self.$name = $name;
                self
            }
        )+
    };
}

/// `name(self, value) -> Self` that sets an `Option` field to `Some(value)`.
macro_rules! option_setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty),+ $(,)?) => {
        $(
            $(#[$doc])*
            #[must_use]
            pub fn $name(mut self, $name: $ty) -> Self {
                self.$name = Some($name);
                self
            }
        )+
    };
}

pub(crate) use {option_setters, setters};
