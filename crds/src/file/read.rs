//! Reading the file from disk: one rule for `--check`, the sidecar's start
//! and its reloads. Only a regular file is read, it is opened without
//! blocking (a FIFO at the path would otherwise hold the open until a
//! writer came), at most [`MAX_FILE_BYTES`] of it are read (a device such as
//! `/dev/zero`, or a file that keeps growing, never exhausts memory), and its
//! text must be UTF-8.

use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use rustix::fs::{Mode, OFlags};

use crate::Error;

/// The largest configuration file read: far above any real configuration
/// (tens of thousands of upstreams fit in a few MiB), low enough that a
/// wrong path or a runaway generator costs little memory.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// A configuration file's text and its metadata, taken from the descriptor
/// that was read (so the two describe the same file even while the path is
/// being swapped).
#[derive(Debug)]
pub struct FileText {
    /// The text, UTF-8.
    pub text: String,
    /// The file's metadata (`fstat`) when it was opened.
    pub metadata: Metadata,
}

/// Reads the regular file at `path`, up to [`MAX_FILE_BYTES`], as UTF-8.
pub fn read(path: &Path) -> Result<FileText, Error> {
    let label = || path.display().to_string();
    let io = |source: std::io::Error| Error::Read {
        path: label(),
        source,
    };
    // O_NONBLOCK: a FIFO opens at once instead of waiting for a writer; a
    // regular file ignores the flag.
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io(e.into()))?;
    let file = File::from(fd);
    let metadata = file.metadata().map_err(io)?;
    if let Some(kind) = not_regular(&metadata) {
        return Err(Error::NotRegular {
            path: label(),
            kind,
        });
    }
    if metadata.len() > MAX_FILE_BYTES {
        return Err(Error::TooLarge {
            path: label(),
            size: metadata.len(),
            limit: MAX_FILE_BYTES,
        });
    }
    // One byte past the limit tells a file that grew after the fstat.
    let mut bytes = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if read > MAX_FILE_BYTES {
        return Err(Error::TooLarge {
            path: label(),
            size: read,
            limit: MAX_FILE_BYTES,
        });
    }
    let text = String::from_utf8(bytes).map_err(|e| Error::NotUtf8 {
        path: label(),
        offset: e.utf8_error().valid_up_to(),
        source: e.utf8_error(),
    })?;
    Ok(FileText { text, metadata })
}

/// What the file is when it is not a regular file.
fn not_regular(metadata: &Metadata) -> Option<&'static str> {
    let t = metadata.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a file")
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// A directory of this test's own under the system's temporary directory.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("reprise-crds-read-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    }

    /// [`read`] of `path` on a thread of its own, so that a read that blocks
    /// fails the test instead of hanging it.
    fn read_within(path: PathBuf, within: Duration) -> Result<FileText, Error> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(read(&path));
        });
        rx.recv_timeout(within)
            .expect("the read returns at once instead of blocking")
    }

    const VALID: &str =
        "upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\n";

    #[test]
    fn a_regular_file_is_read_with_its_metadata() {
        let dir = scratch("regular");
        let path = dir.join("reprise.yaml");
        std::fs::write(&path, VALID).expect("write");
        let got = read(&path).expect("a regular file is read");
        assert_eq!(got.text, VALID);
        assert_eq!(got.metadata.len(), VALID.len() as u64);
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = scratch("fifo");
        let path = dir.join("reprise.yaml");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            Mode::RUSR | Mode::WUSR,
            0,
        )
        .expect("mkfifo");
        let err = read_within(path, Duration::from_secs(5)).expect_err("a FIFO is refused");
        assert!(
            matches!(err, Error::NotRegular { kind: "a FIFO", .. }),
            "{err}"
        );
        assert!(
            err.to_string()
                .ends_with("not a regular file (a FIFO); refused without reading it"),
            "{err}"
        );
    }

    #[test]
    fn a_device_and_a_directory_are_refused_without_reading() {
        let err = read_within("/dev/zero".into(), Duration::from_secs(5))
            .expect_err("a device is refused");
        assert!(
            matches!(
                err,
                Error::NotRegular {
                    kind: "a character device",
                    ..
                }
            ),
            "{err}"
        );
        let dir = scratch("directory");
        let err = read_within(dir, Duration::from_secs(5)).expect_err("a directory is refused");
        assert!(
            matches!(
                err,
                Error::NotRegular {
                    kind: "a directory",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_file_over_the_limit_is_refused_naming_its_size() {
        let dir = scratch("large");
        let path = dir.join("reprise.yaml");
        // A valid configuration padded with a comment past the limit.
        let mut text = String::from(VALID);
        text.push('#');
        text.push_str(&" ".repeat(usize::try_from(MAX_FILE_BYTES).expect("fits")));
        text.push('\n');
        std::fs::write(&path, &text).expect("write");
        let err = read(&path).expect_err("over the limit");
        let size = text.len() as u64;
        assert!(
            matches!(err, Error::TooLarge { size: s, limit: MAX_FILE_BYTES, .. } if s == size),
            "{err}"
        );
        assert!(
            err.to_string().ends_with(&format!(
                "{size} bytes, over the 16777216-byte limit; refused without parsing it"
            )),
            "{err}"
        );
        // At the limit exactly it is read.
        let fits = &text[..usize::try_from(MAX_FILE_BYTES).expect("fits")];
        std::fs::write(&path, fits).expect("write");
        assert_eq!(read(&path).expect("at the limit").text.len(), fits.len());
    }

    #[test]
    fn text_that_is_not_utf8_is_refused_naming_the_byte_offset() {
        let dir = scratch("latin1");
        let path = dir.join("reprise.yaml");
        // "# café" in Latin-1: é is the single byte 0xE9.
        let mut bytes = b"# caf".to_vec();
        let offset = bytes.len();
        bytes.push(0xE9);
        bytes.push(b'\n');
        bytes.extend_from_slice(VALID.as_bytes());
        std::fs::write(&path, &bytes).expect("write");
        let err = read(&path).expect_err("not UTF-8");
        assert!(
            matches!(err, Error::NotUtf8 { offset: o, .. } if o == offset),
            "{err}"
        );
        assert!(
            err.to_string().ends_with("not valid UTF-8 at byte 5"),
            "{err}"
        );
    }
}
