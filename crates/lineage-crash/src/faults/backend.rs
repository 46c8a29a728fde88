//! A redb storage backend over a real file that fails on demand: the n-th operation of one kind
//! after the switch is armed fails with an I/O error, once or until the switch is cleared.
//!
//! Every handle the store opens on the file (it reopens after a failed commit) shares one
//! [`Switch`], so a fault outlives the handle that met it, as a failing disk does.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// Linux's `EIO`: what a failing disk answers to a write or an fsync.
const EIO: i32 = 5;
/// Linux's `ENOSPC`: what a full disk answers to growing a file (`ErrorKind::StorageFull`).
const ENOSPC: i32 = 28;
/// A torn write keeps its first half, rounded down to this many bytes (a disk sector).
const SECTOR: usize = 512;

/// An operation of the backend, as the switch counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Sync,
    SetLen,
}

impl Op {
    const ALL: [Op; 4] = [Op::Read, Op::Write, Op::Sync, Op::SetLen];

    fn index(self) -> usize {
        self as usize
    }
}

/// What kind of fault a plan injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A write fails with `EIO`, nothing of it written.
    Write,
    /// An fsync fails with `EIO`.
    Sync,
    /// Growing or shrinking the file fails with `ENOSPC`.
    SetLen,
    /// A write stores only a prefix of its buffer (its first half, rounded down to a sector),
    /// then fails with `EIO`.
    Torn,
    /// Every read, write, fsync and resize fails with `EIO`: even reopening the file fails.
    Everything,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Write,
        Kind::Sync,
        Kind::SetLen,
        Kind::Torn,
        Kind::Everything,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Write => "write",
            Kind::Sync => "sync",
            Kind::SetLen => "set_len",
            Kind::Torn => "torn",
            Kind::Everything => "everything",
        }
    }

    pub fn parse(word: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == word)
    }

    /// Whether `op` is an operation of this kind (counted towards the n-th, and failed).
    pub fn covers(self, op: Op) -> bool {
        match self {
            Kind::Write | Kind::Torn => op == Op::Write,
            Kind::Sync => op == Op::Sync,
            Kind::SetLen => op == Op::SetLen,
            Kind::Everything => true,
        }
    }

    /// How many operations of this kind `counts` holds.
    pub fn count(self, counts: &OpCounts) -> u64 {
        Op::ALL
            .into_iter()
            .filter(|op| self.covers(*op))
            .map(|op| counts.0[op.index()])
            .sum()
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a fault fails one operation or every later one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Only the n-th operation fails.
    Once,
    /// The n-th operation and every later one of the kind fail, until the switch is cleared.
    Sticky,
}

impl Mode {
    pub const ALL: [Mode; 2] = [Mode::Once, Mode::Sticky];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Once => "once",
            Mode::Sticky => "sticky",
        }
    }

    pub fn parse(word: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == word)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Operations seen since the counts were last reset, by [`Op`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts([u64; 4]);

/// The armed fault.
#[derive(Debug)]
struct Fault {
    kind: Kind,
    mode: Mode,
    /// The operation of the kind that fails first (from 1).
    nth: u64,
    /// Operations of the kind seen since arming.
    seen: u64,
}

#[derive(Debug, Default)]
struct State {
    counts: OpCounts,
    fault: Option<Fault>,
    /// Operations failed since the switch was made.
    failed: u64,
}

/// What the switch decides for one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Pass,
    Fail(Kind),
}

/// The fault switch every handle on one file shares.
#[derive(Debug, Default)]
pub struct Switch(Mutex<State>);

impl Switch {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Restarts the counts of every operation from zero.
    pub fn reset_counts(&self) {
        self.state().counts = OpCounts::default();
    }

    /// Operations seen since the counts were last reset.
    pub fn counts(&self) -> OpCounts {
        self.state().counts
    }

    /// Arms a fault: the `nth` operation of `kind` from now on (from 1) fails, and in sticky mode
    /// every later one too.
    pub fn arm(&self, kind: Kind, mode: Mode, nth: u64) {
        self.state().fault = Some(Fault {
            kind,
            mode,
            nth: nth.max(1),
            seen: 0,
        });
    }

    /// Disarms the fault: storage works again.
    pub fn clear(&self) {
        self.state().fault = None;
    }

    /// Whether a fault is armed (it may have fired or not yet).
    pub fn armed(&self) -> bool {
        self.state().fault.is_some()
    }

    /// Whether the armed fault has failed an operation.
    pub fn fired(&self) -> bool {
        self.state().fault.as_ref().is_some_and(|f| f.seen >= f.nth)
    }

    /// Operations failed in all.
    pub fn failed(&self) -> u64 {
        self.state().failed
    }

    /// Counts `op` and decides whether it fails.
    fn decide(&self, op: Op) -> Verdict {
        let mut state = self.state();
        state.counts.0[op.index()] += 1;
        let Some(fault) = state.fault.as_mut().filter(|f| f.kind.covers(op)) else {
            return Verdict::Pass;
        };
        fault.seen += 1;
        let fails = match fault.mode {
            Mode::Once => fault.seen == fault.nth,
            Mode::Sticky => fault.seen >= fault.nth,
        };
        if !fails {
            return Verdict::Pass;
        }
        let kind = fault.kind;
        state.failed += 1;
        Verdict::Fail(kind)
    }
}

fn injected(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// redb's file backend over one open file, with every read, write, fsync and resize passed
/// through the switch first.
pub struct FaultyFile {
    file: FileBackend,
    switch: Arc<Switch>,
}

impl fmt::Debug for FaultyFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyFile").finish_non_exhaustive()
    }
}

impl FaultyFile {
    /// Opens `path` (which must exist) for reading and writing.
    pub fn open(path: &Path, switch: Arc<Switch>) -> io::Result<FaultyFile> {
        let file: File = OpenOptions::new().read(true).write(true).open(path)?;
        let file = FileBackend::new(file);
        Ok(FaultyFile { file, switch })
    }
}

impl StorageBackend for FaultyFile {
    fn len(&self) -> Result<u64, redb::BackendError> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), redb::BackendError> {
        match self.switch.decide(Op::Read) {
            Verdict::Pass => self.file.read(offset, out),
            Verdict::Fail(_) => Err(injected(EIO).into()),
        }
    }

    fn set_len(&self, len: u64) -> Result<(), redb::BackendError> {
        match self.switch.decide(Op::SetLen) {
            Verdict::Pass => self.file.set_len(len),
            Verdict::Fail(Kind::Everything) => Err(injected(EIO).into()),
            Verdict::Fail(_) => Err(injected(ENOSPC).into()),
        }
    }

    fn sync_data(&self) -> Result<(), redb::BackendError> {
        match self.switch.decide(Op::Sync) {
            Verdict::Pass => self.file.sync_data(),
            Verdict::Fail(_) => Err(injected(EIO).into()),
        }
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), redb::BackendError> {
        match self.switch.decide(Op::Write) {
            Verdict::Pass => self.file.write(offset, data),
            Verdict::Fail(Kind::Torn) => {
                // The disk took the first sectors of the buffer and failed on the rest.
                let kept = data.len() / 2 / SECTOR * SECTOR;
                if kept > 0 {
                    self.file.write(offset, &data[..kept])?;
                }
                Err(injected(EIO).into())
            }
            Verdict::Fail(_) => Err(injected(EIO).into()),
        }
    }

    // Closing and the byte-range locks are the file's own: the store opens the file in redb's
    // single-writer mode, which needs them, and a fault never keeps a lock from being released.
    fn close(&self) -> Result<(), redb::BackendError> {
        self.file.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary file holding `bytes`, opened through a new switch: the directory (the file
    /// lives as long as it), the file's path, the backend and its switch.
    fn faulty_file(
        bytes: &[u8],
    ) -> (
        tempfile::TempDir,
        std::path::PathBuf,
        FaultyFile,
        Arc<Switch>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        std::fs::write(&path, bytes).unwrap();
        let switch = Arc::new(Switch::default());
        let file = FaultyFile::open(&path, switch.clone()).unwrap();
        (dir, path, file, switch)
    }

    /// The OS error code `error` carries.
    fn os_error(error: BackendError) -> Option<i32> {
        io::Error::from(error).raw_os_error()
    }

    #[test]
    fn every_operation_is_counted_by_its_kind() {
        let (_dir, _, file, switch) = faulty_file(&[0; 4096]);
        file.write(0, &[1; 100]).unwrap();
        file.write(100, &[2; 100]).unwrap();
        file.sync_data().unwrap();
        file.set_len(8192).unwrap();
        let mut out = [0u8; 10];
        file.read(0, &mut out).unwrap();
        let counts = switch.counts();
        assert_eq!(Kind::Write.count(&counts), 2);
        assert_eq!(Kind::Torn.count(&counts), 2);
        assert_eq!(Kind::Sync.count(&counts), 1);
        assert_eq!(Kind::SetLen.count(&counts), 1);
        assert_eq!(Kind::Everything.count(&counts), 5);
        switch.reset_counts();
        assert_eq!(Kind::Everything.count(&switch.counts()), 0);
        assert_eq!(switch.failed(), 0);
    }

    #[test]
    fn a_once_fault_fails_only_the_nth_operation_of_its_kind() {
        let (_dir, path, file, switch) = faulty_file(&[0; 4096]);
        switch.arm(Kind::Write, Mode::Once, 3);
        file.sync_data().unwrap(); // another kind: not counted towards the third write
        file.write(0, &[1; 8]).unwrap();
        file.write(8, &[2; 8]).unwrap();
        assert!(!switch.fired());
        assert_eq!(os_error(file.write(16, &[3; 8]).unwrap_err()), Some(EIO));
        assert!(switch.fired());
        file.write(24, &[4; 8]).unwrap();
        assert_eq!(switch.failed(), 1);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..16], &[[1u8; 8], [2; 8]].concat()[..]);
        assert_eq!(&bytes[16..24], &[0; 8], "the failed write wrote nothing");
        assert_eq!(&bytes[24..32], &[4; 8]);
    }

    #[test]
    fn a_sticky_fault_fails_every_later_operation_until_cleared() {
        let (_dir, _, file, switch) = faulty_file(&[0; 4096]);
        switch.arm(Kind::Sync, Mode::Sticky, 2);
        file.sync_data().unwrap();
        for _ in 0..3 {
            assert_eq!(os_error(file.sync_data().unwrap_err()), Some(EIO));
        }
        file.write(0, &[1; 8]).unwrap();
        switch.clear();
        file.sync_data().unwrap();
        assert_eq!(switch.failed(), 3);
    }

    #[test]
    fn a_set_len_fault_says_the_disk_is_full() {
        let (_dir, _, file, switch) = faulty_file(&[0; 4096]);
        switch.arm(Kind::SetLen, Mode::Once, 1);
        let error = file.set_len(1 << 20).unwrap_err();
        assert_eq!(io::Error::from(error).kind(), io::ErrorKind::StorageFull);
        assert_eq!(file.len().unwrap(), 4096);
    }

    #[test]
    fn a_torn_write_keeps_whole_sectors_of_its_first_half() {
        let (_dir, path, file, switch) = faulty_file(&[0; 8192]);
        switch.arm(Kind::Torn, Mode::Once, 1);
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8 + 1).collect();
        assert_eq!(os_error(file.write(1000, &data).unwrap_err()), Some(EIO));
        let bytes = std::fs::read(&path).unwrap();
        // Half of 3000 is 1500, rounded down to sectors: 1024 bytes kept.
        assert_eq!(&bytes[1000..2024], &data[..1024]);
        assert!(bytes[2024..4000].iter().all(|b| *b == 0));
        // A write shorter than two sectors keeps nothing.
        switch.arm(Kind::Torn, Mode::Once, 1);
        assert!(file.write(5000, &[9; 1000]).is_err());
        assert!(
            std::fs::read(&path).unwrap()[5000..6000]
                .iter()
                .all(|b| *b == 0)
        );
    }

    #[test]
    fn everything_fails_reads_too_and_outlives_a_reopen() {
        let (_dir, path, file, switch) = faulty_file(&[7; 4096]);
        switch.arm(Kind::Everything, Mode::Sticky, 1);
        let mut out = [0u8; 4];
        assert!(file.read(0, &mut out).is_err());
        assert!(file.write(0, &[1]).is_err());
        assert!(file.sync_data().is_err());
        assert!(file.set_len(0).is_err());
        // A second handle on the file shares the switch, as the store's reopen does.
        let again = FaultyFile::open(&path, switch.clone()).unwrap();
        assert!(again.read(0, &mut out).is_err());
        switch.clear();
        again.read(0, &mut out).unwrap();
        assert_eq!(out, [7; 4]);
        assert_eq!(switch.failed(), 5);
    }
}
