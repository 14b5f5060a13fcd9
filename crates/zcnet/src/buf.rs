//! Page-aligned, pre-faulted transmit buffers with loan semantics.
//!
//! A [`Pool`] owns a fixed number of equal buffers; [`TxBuf`] is one of them, taken out and
//! filled by the application, then *moved* into [`crate::Sender::send`]. The sender keeps it
//! until the kernel's completion covers every call that named its pages, and only then drops
//! it, which puts it back in the pool. Reusing a buffer before that is impossible: the
//! application no longer has it. The pool size is the flow-control bound the Solaris paper
//! recommends (a ring larger than sndbuf + window keeps the sender from waiting), and the
//! NEC paper's "allocate+map, fill, release on transmit" API.

use std::fmt;
use std::ops::{Deref, DerefMut, Range};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use zcnet_sys::mem::{page_size, PageBuf};

/// Pools of at least this many bytes are carved from huge pages ([`Pool::new_huge`]): a
/// quarter of a 2 MiB huge page, so rounding up at most quadruples a small pool's memory.
pub(crate) const HUGE_POOL_FROM: usize = 512 << 10;

struct PoolInner {
    /// Carved from one mapping advised for huge pages ([`Pool::new_huge`]).
    huge: bool,
    free: Mutex<Vec<PageBuf>>,
    returned: Condvar,
    /// Threads in [`Pool::take_timeout`]'s wait, changed and read only under `free`'s lock:
    /// a returned buffer signals `returned` only when one waits, since std's condvar makes a
    /// `futex` call per notify whether or not anyone sleeps (one syscall per message sent).
    waiting: std::sync::atomic::AtomicUsize,
    buf_bytes: usize,
    count: usize,
    retired: std::sync::atomic::AtomicUsize,
    /// `(address, length)` of every buffer, in creation order: the index is [`TxBuf::index`].
    regions: Vec<(usize, usize)>,
    /// `(address, index)` sorted by address, to find a buffer's index.
    by_addr: Vec<(usize, usize)>,
}

/// A fixed set of page-aligned, pre-faulted buffers. Cloning shares the pool.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("count", &self.inner.count)
            .field("buf_bytes", &self.inner.buf_bytes)
            .field("available", &self.available())
            .finish()
    }
}

impl Pool {
    /// `count` buffers of `buf_bytes` bytes each (rounded up to whole pages), mapped and
    /// faulted in now so the data path never faults.
    pub fn new(count: usize, buf_bytes: usize) -> std::io::Result<Pool> {
        let bufs = (0..count)
            .map(|_| PageBuf::new(buf_bytes))
            .collect::<std::io::Result<Vec<_>>>()?;
        Self::from_bufs(bufs, buf_bytes, count, false)
    }

    /// [`Pool::new`], but a pool of `HUGE_POOL_FROM` bytes or more is carved from one
    /// mapping in 2 MiB huge pages where the kernel offers them
    /// ([`zcnet_sys::mem::PageBuf::carve_huge`]): a `MSG_ZEROCOPY` send pins its pages one
    /// reference per page, and a huge page is one page. For `sendmsg` senders only: on
    /// Linux 6.18, io_uring `SEND_ZC` from such a pool registered as fixed buffers stalled
    /// in two of our tests (a short send never continued; a 1 MiB send stopped at 20 KiB),
    /// and each datagram from it is charged `PAGE_ALIGN(its offset in the 2 MiB folio +
    /// len)` of socket memory (io_uring coalesces the buffer into one `bvec` per folio;
    /// ~25 MB for a 1 MiB message at a local receiver), so the io_uring paths keep
    /// [`Pool::new`].
    pub fn new_huge(count: usize, buf_bytes: usize) -> std::io::Result<Pool> {
        let each = zcnet_sys::mem::round_to_pages(buf_bytes);
        if count.saturating_mul(each) < HUGE_POOL_FROM || !zcnet_sys::mem::thp_available() {
            return Self::new(count, buf_bytes);
        }
        let bufs = PageBuf::carve_huge(count, each)?;
        Self::from_bufs(bufs, buf_bytes, count, true)
    }

    fn from_bufs(
        bufs: Vec<PageBuf>,
        buf_bytes: usize,
        count: usize,
        huge: bool,
    ) -> std::io::Result<Pool> {
        let buf_bytes = bufs.first().map_or(buf_bytes, PageBuf::len);
        let regions: Vec<(usize, usize)> = bufs
            .iter()
            .map(|b| (b.as_ptr() as usize, b.len()))
            .collect();
        let mut by_addr: Vec<(usize, usize)> =
            regions.iter().enumerate().map(|(i, r)| (r.0, i)).collect();
        by_addr.sort_unstable();
        Ok(Pool {
            inner: Arc::new(PoolInner {
                huge,
                free: Mutex::new(bufs),
                returned: Condvar::new(),
                waiting: std::sync::atomic::AtomicUsize::new(0),
                buf_bytes,
                count,
                retired: Default::default(),
                regions,
                by_addr,
            }),
        })
    }

    /// `(address, length)` of every buffer the pool was created with, indexed by
    /// [`TxBuf::index`]: what `io_uring_register_buffers(3)` needs to register the pool as
    /// fixed buffers, whose pages the kernel then pins once instead of per send. Retired
    /// buffers stay listed (their index is never handed out again).
    pub fn regions(&self) -> &[(usize, usize)] {
        &self.inner.regions
    }

    /// Size of each buffer (a whole number of pages).
    pub fn buf_bytes(&self) -> usize {
        self.inner.buf_bytes
    }

    /// Number of buffers the pool owns.
    pub fn count(&self) -> usize {
        self.inner.count
    }

    /// Whether the buffers were carved from one mapping advised `MADV_HUGEPAGE` (whether
    /// the kernel then gave huge pages is `AnonHugePages` in /proc/self/smaps).
    pub fn huge_pages(&self) -> bool {
        self.inner.huge
    }

    /// Buffers taken out of use because their socket was abandoned with sends in flight.
    pub fn retired(&self) -> usize {
        self.inner
            .retired
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Buffers in the pool right now.
    pub fn available(&self) -> usize {
        self.inner.free.lock().map_or(0, |f| f.len())
    }

    /// Takes a buffer if one is free. Its data range starts empty.
    pub fn try_take(&self) -> Option<TxBuf> {
        let mem = self.inner.free.lock().ok()?.pop()?;
        Some(TxBuf {
            mem: Some(mem),
            range: 0..0,
            pool: self.inner.clone(),
        })
    }

    /// Takes a buffer, waiting up to `timeout` for one to be returned. Senders that also
    /// need to reap completions while waiting use [`crate::Sender::buffer`] instead.
    pub fn take_timeout(&self, timeout: Duration) -> Option<TxBuf> {
        let deadline = Instant::now() + timeout;
        let mut free = self.inner.free.lock().ok()?;
        loop {
            if let Some(mem) = free.pop() {
                return Some(TxBuf {
                    mem: Some(mem),
                    range: 0..0,
                    pool: self.inner.clone(),
                });
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            self.inner.waiting.fetch_add(1, Relaxed);
            let woke = self.inner.returned.wait_timeout(free, left);
            self.inner.waiting.fetch_sub(1, Relaxed);
            free = woke.ok()?.0;
        }
    }

    /// Whether `buf` came from this pool.
    pub fn owns(&self, buf: &TxBuf) -> bool {
        Arc::ptr_eq(&self.inner, &buf.pool)
    }
}

/// One loaned transmit buffer: page-aligned storage plus the byte range to send.
///
/// Like a fresh `Vec::with_capacity`, a fresh buffer holds nothing: it dereferences to the
/// *selected* bytes, so `len() == 0` and [`TxBuf::capacity`] is the room. Fill it either
/// way:
///
/// * append — [`TxBuf::append`] (or `io::Write`), or a read straight into
///   [`TxBuf::spare_mut`] followed by [`TxBuf::commit`], until [`TxBuf::is_full`];
/// * in place — [`TxBuf::fill_at`], or write [`TxBuf::storage_mut`] and
///   [`TxBuf::set_len`]/[`TxBuf::set_range`].
///
/// Dropping it returns the storage to its pool, which is why the sender holds it until the
/// kernel is done with its pages.
///
/// ```
/// # fn main() -> std::io::Result<()> {
/// use std::io::Read;
/// let pool = zcnet::Pool::new(1, 64 * 1024)?;
/// let mut buf = pool.try_take().unwrap();
/// assert_eq!((buf.len(), buf.capacity()), (0, 64 * 1024));
/// let mut src: &[u8] = &[7u8; 100_000];
/// while !buf.is_full() {
///     let n = src.read(buf.spare_mut())?;
///     if n == 0 { break; }
///     buf.commit(n);
/// }
/// assert_eq!(buf.len(), 64 * 1024); // full: the loop ends
/// assert_eq!(buf.append(b"more"), 0); // nothing fits
/// # Ok(()) }
/// ```
pub struct TxBuf {
    mem: Option<PageBuf>,
    range: Range<usize>,
    pool: Arc<PoolInner>,
}

impl fmt::Debug for TxBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxBuf")
            .field("capacity", &self.capacity())
            .field("range", &self.range)
            .finish()
    }
}

impl TxBuf {
    fn mem(&self) -> &PageBuf {
        self.mem.as_ref().expect("TxBuf storage present until drop")
    }

    /// Bytes of storage.
    pub fn capacity(&self) -> usize {
        self.mem().len()
    }

    /// The whole storage, for filling in place (the zero-copy way: write once, send).
    pub fn storage_mut(&mut self) -> &mut [u8] {
        self.mem
            .as_mut()
            .expect("TxBuf storage present until drop")
            .as_mut_slice()
    }

    /// Selects which bytes of the storage [`crate::Sender::send`] sends. Panics if the range
    /// is outside the storage.
    pub fn set_range(&mut self, range: Range<usize>) {
        assert!(
            range.start <= range.end && range.end <= self.capacity(),
            "range {range:?} outside buffer of {} bytes",
            self.capacity()
        );
        self.range = range;
    }

    /// Selects `0..len`.
    pub fn set_len(&mut self, len: usize) {
        self.set_range(0..len);
    }

    /// Copies `data` in at `offset` and selects exactly it. Panics if it does not fit.
    pub fn fill_at(&mut self, offset: usize, data: &[u8]) {
        let end = offset + data.len();
        self.storage_mut()[offset..end].copy_from_slice(data);
        self.set_range(offset..end);
    }

    /// The storage after the selected range, for reading into (then [`TxBuf::commit`]).
    pub fn spare_mut(&mut self) -> &mut [u8] {
        let end = self.range.end;
        &mut self.storage_mut()[end..]
    }

    /// Adds the next `n` bytes of storage (written through [`TxBuf::spare_mut`]) to the
    /// selection. Panics past the capacity.
    pub fn commit(&mut self, n: usize) {
        self.set_range(self.range.start..self.range.end + n);
    }

    /// Copies as much of `data` as fits after the selection and selects it too; returns how
    /// much that was (0 once [`TxBuf::is_full`]).
    pub fn append(&mut self, data: &[u8]) -> usize {
        let spare = self.spare_mut();
        let n = data.len().min(spare.len());
        spare[..n].copy_from_slice(&data[..n]);
        self.commit(n);
        n
    }

    /// Whether the selection reaches the end of the storage: nothing more can be appended.
    pub fn is_full(&self) -> bool {
        self.range.end == self.capacity()
    }

    /// The selected range.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// Whether the selected data starts on a page boundary.
    pub fn is_page_aligned(&self) -> bool {
        (self.mem().as_ptr() as usize + self.range.start).is_multiple_of(page_size())
    }

    /// Drops the storage instead of returning it to the pool: for a buffer the kernel may
    /// still read (its socket was abandoned with sends in flight), so no later send can
    /// overwrite bytes still on their way. The pool is one buffer smaller afterwards. (Its
    /// own mapping is unmapped now; a buffer carved from the pool's shared mapping goes
    /// with the pool's last buffer.) Public for a sender outside this crate that keeps its
    /// own [`crate::zc::Completions`] of pool buffers (`zcnet-msg`'s) and gives up the
    /// loans [`crate::zc::Completions::abandon`] returns.
    pub fn retire(mut self) {
        drop(self.mem.take());
        self.pool
            .retired
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// This buffer's position in its pool's [`Pool::regions`] (the fixed-buffer index an
    /// io_uring `SEND_ZC` names with `IORING_RECVSEND_FIXED_BUF`).
    pub fn index(&self) -> usize {
        let addr = self.mem().as_ptr() as usize;
        let by_addr = &self.pool.by_addr;
        let i = by_addr
            .binary_search_by_key(&addr, |&(a, _)| a)
            .expect("a TxBuf's storage is one of its pool's buffers");
        by_addr[i].1
    }

    /// Address of the first selected byte (for the policy's alignment rule).
    pub fn data_addr(&self) -> usize {
        self.mem().as_ptr() as usize + self.range.start
    }
}

/// Appends ([`TxBuf::append`]); a full buffer takes 0 bytes, so `write_all` ends with
/// `WriteZero` rather than spinning.
impl std::io::Write for TxBuf {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        Ok(self.append(data))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Deref for TxBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.mem().as_slice()[self.range.clone()]
    }
}

impl DerefMut for TxBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        let r = self.range.clone();
        &mut self.storage_mut()[r]
    }
}

impl Drop for TxBuf {
    fn drop(&mut self) {
        if let Some(mem) = self.mem.take() {
            if let Ok(mut free) = self.pool.free.lock() {
                free.push(mem);
                if self.pool.waiting.load(Relaxed) > 0 {
                    self.pool.returned.notify_one();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_return_on_drop_and_pool_bounds_them() {
        let pool = Pool::new(2, 5000).unwrap();
        assert_eq!(pool.buf_bytes(), 8192);
        let mut a = pool.try_take().unwrap();
        let b = pool.try_take().unwrap();
        assert!(pool.try_take().is_none());
        assert!(pool.take_timeout(Duration::from_millis(20)).is_none());
        a.fill_at(1, b"hello");
        assert_eq!(&a[..], b"hello");
        assert!(!a.is_page_aligned());
        a.set_len(3);
        assert!(a.is_page_aligned());
        assert!(pool.owns(&a));
        drop(b);
        assert_eq!(pool.available(), 1);
        let regions = pool.regions();
        assert_eq!(regions.len(), 2);
        assert_eq!(regions[a.index()].0, a.storage_mut().as_ptr() as usize);
        assert_eq!(regions[a.index()].1, 8192);
        let other = Pool::new(1, 10).unwrap();
        assert!(!other.owns(&a));
    }

    /// Where transparent huge pages are on, a pool large enough is carved for them.
    #[cfg_attr(
        not(zcnet_has_thp),
        ignore = "needs transparent huge pages on (always or madvise in /sys/kernel/mm/transparent_hugepage/enabled)"
    )]
    #[test]
    fn a_large_pool_is_carved_for_huge_pages_where_the_kernel_has_them() {
        assert!(zcnet_sys::mem::thp_available(), "the build found THP on");
        assert!(Pool::new_huge(8, 68 << 10).unwrap().huge_pages());
    }

    #[test]
    fn a_huge_pool_hands_out_distinct_buffers_it_can_index() {
        let pool = Pool::new_huge(8, 68 << 10).unwrap();
        assert!(!Pool::new(8, 68 << 10).unwrap().huge_pages());
        assert_eq!(
            pool.huge_pages(),
            zcnet_sys::mem::thp_available(),
            "8 x 68 KiB is past HUGE_POOL_FROM: carved where huge pages may back it"
        );
        assert!(
            !Pool::new_huge(2, 4096).unwrap().huge_pages(),
            "too small to carve"
        );
        let mut held: Vec<TxBuf> = (0..8).map(|_| pool.try_take().unwrap()).collect();
        assert!(pool.try_take().is_none());
        for (k, b) in held.iter_mut().enumerate() {
            assert_eq!(b.capacity(), pool.buf_bytes());
            b.fill_at(0, &vec![k as u8; b.capacity()]);
        }
        let mut seen = std::collections::BTreeSet::new();
        for (k, b) in held.iter().enumerate() {
            assert!(b.iter().all(|&x| x == k as u8), "buffer {k} kept its bytes");
            assert!(b.is_page_aligned());
            assert!(seen.insert(b.index()), "indices are distinct");
            assert_eq!(pool.regions()[b.index()].0, b.data_addr());
        }
        // A retired buffer leaves the pool; the others come back and stay intact.
        held.pop().unwrap().retire();
        drop(held);
        assert_eq!(pool.available(), 7);
        assert_eq!(pool.retired(), 1);
    }

    #[test]
    fn waiter_wakes_when_a_buffer_returns() {
        let pool = Pool::new(1, 4096).unwrap();
        let held = pool.try_take().unwrap();
        let p2 = pool.clone();
        let t = std::thread::spawn(move || p2.take_timeout(Duration::from_secs(10)).is_some());
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        assert!(t.join().unwrap());
    }

    #[test]
    fn a_waiter_already_asleep_is_woken_by_the_return() {
        // The return signals only when someone waits: the waiter must be counted before it
        // sleeps, or this wake-up would be lost.
        let pool = Pool::new(1, 4096).unwrap();
        let held = pool.try_take().unwrap();
        let p2 = pool.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let got = p2.take_timeout(Duration::from_secs(600)).is_some();
            let _ = tx.send(got);
        });
        let mut spins = 0;
        while pool.inner.waiting.load(Relaxed) == 0 {
            spins += 1;
            assert!(spins < 10_000, "the waiter never started waiting");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(held);
        // A hang guard, not a speed check: the waiter's own timeout is ten minutes.
        let got = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the waiter was not woken by the returned buffer");
        assert!(got);
        assert_eq!(pool.inner.waiting.load(Relaxed), 0);
    }

    #[test]
    #[should_panic(expected = "outside buffer")]
    fn range_beyond_storage_panics() {
        let pool = Pool::new(1, 4096).unwrap();
        pool.try_take().unwrap().set_range(0..4097);
    }
}
