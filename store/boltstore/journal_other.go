//go:build !linux

package boltstore

import "os"

// preallocate sizes f to size: where fallocate is not available, an
// append's sync may also write the file's metadata.
func preallocate(f *os.File, size int64) error {
	if st, err := f.Stat(); err != nil || st.Size() >= size {
		return err
	}
	return f.Truncate(size)
}

// datasync flushes f (fsync: data and metadata).
func datasync(f *os.File) error { return f.Sync() }
