//! `ByteCorpus`: a sorted set of shard files seen as ONE circular byte string.
//!
//! Shards are memory-mapped (nothing is read into RAM up front) or, with `resident`, copied
//! into one buffer. Offsets are 64-bit throughout, so corpora and single shards past 4 GiB
//! work.
//!
//! A memory map is only safe while its file keeps its size: reading a page past the end of a
//! truncated file kills the process with SIGBUS. So the corpus keeps each shard's file handle,
//! size, mtime and identity: [`ByteCorpus::check_shards`] compares size and mtime on the held
//! handle, and the stream calls it for the shards a window touches before reading them;
//! [`ByteCorpus::check_paths`] notices a shard replaced on disk. The race that remains: a
//! shard truncated in the few milliseconds between the check and the reads of the same window
//! still raises SIGBUS. `resident` corpora need no checks.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use memmap2::{Mmap, MmapOptions};

use crate::error::{Error, Result};

/// One shard: a file of the corpus and where it sits in the circular string.
#[derive(Debug)]
pub struct Shard {
    path: PathBuf,
    name: String,
    size: u64,
    start: u64,
    /// Held open so that size checks see the mapped file even if the path is replaced.
    file: Option<File>,
    mtime: Option<SystemTime>,
    identity: Option<(u64, u64)>,
    map: Option<Mmap>,
}

impl Shard {
    /// The path as matched (globs expanded).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file name: what the signature records, so that a corpus moved to another
    /// directory still matches a saved state.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Size in bytes when the corpus was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Offset of the shard's first byte in the circular string.
    pub fn start(&self) -> u64 {
        self.start
    }
}

/// The corpus signature: shard names and sizes, in order.
pub type Signature = Vec<(String, u64)>;

#[derive(Debug)]
pub struct ByteCorpus {
    shards: Vec<Shard>,
    size: u64,
    /// The whole string when the corpus is resident.
    resident: Option<Vec<u8>>,
    /// Start offsets of the non-empty shards, ascending, and their indices in `shards`.
    data_starts: Vec<u64>,
    data_shards: Vec<usize>,
}

const GLOB_CHARS: &[char] = &['*', '?', '['];

/// Expand files and globs into a sorted, de-duplicated list of paths.
pub fn expand_paths<S: AsRef<str>>(patterns: &[S]) -> Result<Vec<PathBuf>> {
    if patterns.is_empty() {
        return Err(Error::NoPaths);
    }
    let cwd = || {
        std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|_| "?".into())
    };
    let options = glob::MatchOptions {
        require_literal_leading_dot: true, // like the shell: '*' does not match dotfiles
        ..Default::default()
    };
    let mut paths = Vec::new();
    for pattern in patterns {
        let pattern = pattern.as_ref();
        let before = paths.len();
        if pattern.contains(GLOB_CHARS) {
            let matches = glob::glob_with(pattern, options).map_err(|e| Error::BadPattern {
                pattern: pattern.to_string(),
                reason: e.msg.to_string(),
            })?;
            for m in matches {
                let path = m.map_err(|e| {
                    let path = e.path().to_path_buf();
                    Error::io("read directory", &path, e.into())
                })?;
                paths.push(path);
            }
        } else if fs::symlink_metadata(pattern).is_ok() {
            // Existing (possibly a dangling link: opening it gives the real error).
            paths.push(PathBuf::from(pattern));
        }
        if paths.len() == before {
            return Err(Error::NoMatch {
                pattern: pattern.to_string(),
                cwd: cwd(),
            });
        }
    }
    paths.sort();
    paths.dedup();
    Ok(paths)
}

fn file_identity(meta: &fs::Metadata) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

impl ByteCorpus {
    /// Open the shards matched by `patterns` (files or globs), sorted by path.
    pub fn open<S: AsRef<str>>(patterns: &[S], resident: bool) -> Result<ByteCorpus> {
        let paths = expand_paths(patterns)?;
        let mut shards = Vec::with_capacity(paths.len());
        let mut start = 0u64;
        for path in paths {
            let shard = open_shard(path, start)?;
            start += shard.size;
            shards.push(shard);
        }
        let size = start;
        if size == 0 {
            let names: Vec<String> = shards
                .iter()
                .map(|s| s.path.display().to_string())
                .collect();
            return Err(Error::EmptyCorpus {
                shards: names.join(", "),
            });
        }
        let (data_starts, data_shards) = shards
            .iter()
            .enumerate()
            .filter(|(_, s)| s.size > 0)
            .map(|(i, s)| (s.start, i))
            .unzip();
        let mut corpus = ByteCorpus {
            shards,
            size,
            resident: None,
            data_starts,
            data_shards,
        };
        if resident {
            corpus.make_resident()?;
        }
        Ok(corpus)
    }

    /// Copy every shard into one buffer and drop the maps and file handles.
    fn make_resident(&mut self) -> Result<()> {
        let n = usize::try_from(self.size).map_err(|_| Error::OutOfMemory { bytes: self.size })?;
        let mut data = Vec::new();
        data.try_reserve_exact(n)
            .map_err(|_| Error::OutOfMemory { bytes: self.size })?;
        for shard in &mut self.shards {
            if let Some(mut file) = shard.file.take() {
                let before = data.len();
                (&mut file)
                    .take(shard.size)
                    .read_to_end(&mut data)
                    .map_err(|e| Error::io("read", &shard.path, e))?;
                let got = (data.len() - before) as u64;
                if got != shard.size {
                    return Err(Error::ShardResized {
                        path: shard.path.display().to_string(),
                        expected: shard.size,
                        actual: got,
                    });
                }
            }
            shard.map = None;
        }
        self.resident = Some(data);
        Ok(())
    }

    /// Total size in bytes (> 0).
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    pub fn is_resident(&self) -> bool {
        self.resident.is_some()
    }

    pub fn signature(&self) -> Signature {
        self.shards
            .iter()
            .map(|s| (s.name.clone(), s.size))
            .collect()
    }

    /// Index into `data_starts` of the non-empty shard holding `offset` (< size).
    #[inline]
    fn data_index(&self, offset: u64) -> usize {
        self.data_starts.partition_point(|&s| s <= offset) - 1
    }

    /// Fill `buf` with the circular string's bytes from `offset` on (wrapping as often as
    /// needed).
    pub fn read_circular(&self, offset: u64, buf: &mut [u8]) {
        let mut off = offset % self.size;
        let mut filled = 0;
        while filled < buf.len() {
            let want = buf.len() - filled;
            let src: &[u8] = match &self.resident {
                Some(data) => &data[off as usize..],
                None => {
                    let shard = &self.shards[self.data_shards[self.data_index(off)]];
                    let map = shard.map.as_ref().expect("non-empty shards are mapped");
                    &map[(off - shard.start) as usize..]
                }
            };
            let n = want.min(src.len());
            buf[filled..filled + n].copy_from_slice(&src[..n]);
            filled += n;
            off += n as u64;
            if off == self.size {
                off = 0;
            }
        }
    }

    /// Mark (in `touched`, one flag per shard) the shards that the `len` bytes from `offset`
    /// on (circularly) come from.
    pub fn mark_shards(&self, offset: u64, len: u64, touched: &mut [bool]) {
        if len >= self.size {
            for &i in &self.data_shards {
                touched[i] = true;
            }
            return;
        }
        let mut j = self.data_index(offset % self.size);
        let mut off = offset % self.size;
        let mut left = len;
        while left > 0 {
            let shard = &self.shards[self.data_shards[j]];
            touched[self.data_shards[j]] = true;
            let n = left.min(shard.start + shard.size - off);
            left -= n;
            off += n;
            j += 1;
            if j == self.data_shards.len() {
                j = 0;
                off = 0;
            }
        }
    }

    /// Check that the marked shards still have the size and mtime they had when opened, on
    /// the file handles the maps come from. Must pass before reading a memory-mapped shard
    /// (see the module doc). One `fstat` per marked shard.
    pub fn check_shards(&self, touched: &[bool]) -> Result<()> {
        if self.resident.is_some() {
            return Ok(());
        }
        for (shard, _) in self.shards.iter().zip(touched).filter(|(_, &t)| t) {
            shard.check_handle()?;
        }
        Ok(())
    }

    /// Check that the paths of `count` shards from index `first` on (cyclically) still name
    /// the files that were opened (not replaced, e.g. by a rename). Replacing a shard cannot
    /// crash the loader, which keeps reading the file it holds, so callers spread these
    /// checks (a path lookup each) over windows. Returns the index to continue from.
    pub fn check_paths(&self, first: usize, count: usize) -> Result<usize> {
        let n = self.shards.len();
        if self.resident.is_some() {
            return Ok(first);
        }
        for i in 0..count.min(n) {
            self.shards[(first + i) % n].check_path()?;
        }
        Ok((first + count) % n)
    }

    /// Check every shard's handle and path.
    pub fn check_all_shards(&self) -> Result<()> {
        self.check_shards(&vec![true; self.shards.len()])?;
        self.check_paths(0, self.shards.len()).map(|_| ())
    }
}

impl Shard {
    fn check_handle(&self) -> Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let meta = file
            .metadata()
            .map_err(|e| Error::io("check", &self.path, e))?;
        if meta.len() != self.size {
            return Err(Error::ShardResized {
                path: self.path.display().to_string(),
                expected: self.size,
                actual: meta.len(),
            });
        }
        if meta.modified().ok() != self.mtime {
            return Err(Error::ShardModified {
                path: self.path.display().to_string(),
            });
        }
        Ok(())
    }

    fn check_path(&self) -> Result<()> {
        if self.file.is_none() {
            return Ok(());
        }
        let on_disk = fs::metadata(&self.path).ok();
        if on_disk.is_none() || on_disk.as_ref().and_then(file_identity) != self.identity {
            return Err(Error::ShardReplaced {
                path: self.path.display().to_string(),
            });
        }
        Ok(())
    }
}

fn open_shard(path: PathBuf, start: u64) -> Result<Shard> {
    let meta = fs::metadata(&path).map_err(|e| Error::io("open", &path, e))?;
    if meta.is_dir() {
        return Err(Error::IsDirectory {
            path: path.display().to_string(),
        });
    }
    if !meta.is_file() {
        return Err(Error::NotAFile {
            path: path.display().to_string(),
        });
    }
    let file = File::open(&path).map_err(|e| Error::io("open", &path, e))?;
    // Size, mtime and identity from the handle we will map, not from the path.
    let meta = file.metadata().map_err(|e| Error::io("open", &path, e))?;
    let size = meta.len();
    let map = if size == 0 {
        None // an empty file cannot be mapped, and is never read
    } else {
        let len = usize::try_from(size).map_err(|_| Error::Io {
            action: "map",
            path: path.display().to_string(),
            source: std::io::Error::other("the shard is larger than this platform's memory"),
        })?;
        // SAFETY: the map is only read after `check_shards` has confirmed that the file still
        // has this size (see the module doc for the race that remains).
        let map = unsafe { MmapOptions::new().len(len).map(&file) }
            .map_err(|e| Error::io("memory-map", &path, e))?;
        Some(map)
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    Ok(Shard {
        name,
        size,
        start,
        mtime: meta.modified().ok(),
        identity: file_identity(&meta),
        file: Some(file),
        map,
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
        let p = dir.join(name);
        File::create(&p).unwrap().write_all(data).unwrap();
        p
    }

    fn pattern(dir: &Path, glob: &str) -> String {
        dir.join(glob).display().to_string()
    }

    #[test]
    fn shards_are_sorted_and_read_as_one_circular_string() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "b.txt", b"BBB");
        write(dir.path(), "a.txt", b"aa");
        write(dir.path(), "c.txt", b"");
        write(dir.path(), "d.txt", b"d");
        for resident in [false, true] {
            let c = ByteCorpus::open(&[pattern(dir.path(), "*.txt")], resident).unwrap();
            assert_eq!(c.size(), 6);
            assert_eq!(
                c.signature(),
                [("a.txt", 2), ("b.txt", 3), ("c.txt", 0), ("d.txt", 1)]
                    .map(|(n, s)| (n.to_string(), s))
            );
            let mut buf = [0u8; 4];
            c.read_circular(4, &mut buf);
            assert_eq!(&buf, b"Bdaa");
            let mut buf = [0u8; 15];
            c.read_circular(4, &mut buf);
            assert_eq!(&buf, b"BdaaBBBdaaBBBda");
            c.check_all_shards().unwrap();
        }
    }

    #[test]
    fn shards_know_their_path_name_size_and_start() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "b.txt", b"BBB");
        write(dir.path(), "a.txt", b"aa");
        write(dir.path(), "c.txt", b"");
        write(
            dir.path(),
            ".hidden.txt",
            b"not a shard: '*' skips dotfiles, as the shell does",
        );
        let c = ByteCorpus::open(&[pattern(dir.path(), "*.txt")], false).unwrap();
        let got: Vec<(&str, u64, u64)> = c
            .shards()
            .iter()
            .map(|s| (s.name(), s.size(), s.start()))
            .collect();
        assert_eq!(got, [("a.txt", 2, 0), ("b.txt", 3, 2), ("c.txt", 0, 5)]);
        assert_eq!(c.shards()[1].path(), dir.path().join("b.txt"));
        assert!(!c.is_resident());
    }

    #[test]
    fn replaced_shards_are_found_by_the_cyclic_path_checks() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..10 {
            write(dir.path(), &format!("{i}"), b"data");
        }
        let c = ByteCorpus::open(&[pattern(dir.path(), "?")], false).unwrap();
        write(dir.path(), "new", b"DATA");
        fs::rename(dir.path().join("new"), dir.path().join("7")).unwrap();
        assert_eq!(c.check_paths(0, 4).unwrap(), 4); // shards 0-3 are fine
        let err = c.check_paths(4, 4).unwrap_err();
        assert!(matches!(err, Error::ShardReplaced { ref path } if path.ends_with("7")));
        c.check_shards(&[true; 10]).unwrap(); // the held handles still see the old files
        let mut buf = [0u8; 4];
        c.read_circular(28, &mut buf);
        assert_eq!(&buf, b"data");
    }

    #[test]
    fn marks_the_shards_a_read_touches() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "0", b"0000");
        write(dir.path(), "1", b"");
        write(dir.path(), "2", b"22");
        write(dir.path(), "3", b"3333");
        let c = ByteCorpus::open(&[pattern(dir.path(), "?")], false).unwrap();
        let marks = |offset, len| {
            let mut t = vec![false; 4];
            c.mark_shards(offset, len, &mut t);
            t
        };
        assert_eq!(marks(0, 1), [true, false, false, false]);
        assert_eq!(marks(3, 2), [true, false, true, false]);
        assert_eq!(marks(9, 2), [true, false, false, true]); // wraps
        assert_eq!(marks(5, 4), [false, false, true, true]);
        assert_eq!(marks(1, 10), [true, false, true, true]);
    }
}
