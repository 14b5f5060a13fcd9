//! userfaultfd write-protect (`UFFD_USER_MODE_ONLY`, `UFFDIO_REGISTER_MODE_WP`).
