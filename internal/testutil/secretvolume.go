package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
)

// SecretVolume is a directory laid out as the kubelet lays out a Secret or
// ConfigMap volume: every key is a symlink "key -> ..data/key", "..data"
// is a symlink to a hidden directory holding the payload, and an update
// writes a new hidden directory and swaps "..data" to it with one rename,
// so a reader sees the old payload or the new one, never a mix.
type SecretVolume struct {
	t   testing.TB
	dir string
	gen atomic.Int64
}

// NewSecretVolume lays out payload (key -> content) in a new directory of
// t's; Cleanup removes it with the test's temporary files.
func NewSecretVolume(t testing.TB, payload map[string]string) *SecretVolume {
	t.Helper()
	v := &SecretVolume{t: t, dir: t.TempDir()}
	v.Update(payload)
	return v
}

// Dir is the volume's mount point.
func (v *SecretVolume) Dir() string { return v.dir }

// Path is the file a container reads for key.
func (v *SecretVolume) Path(key string) string { return filepath.Join(v.dir, key) }

// Update swaps the volume to payload: write the new hidden directory, point
// "..data_tmp" at it, rename that over "..data", add the symlinks of new
// keys, then remove the old directory and the symlinks of keys gone.
func (v *SecretVolume) Update(payload map[string]string) {
	v.t.Helper()
	if err := v.update(payload); err != nil {
		v.t.Fatalf("secret volume %s: %v", v.dir, err)
	}
}

func (v *SecretVolume) update(payload map[string]string) error {
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	ts := fmt.Sprintf("..gen_%06d", v.gen.Add(1))
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o755); err != nil {
		return err
	}
	for k, content := range payload {
		if strings.ContainsRune(k, '/') || strings.HasPrefix(k, "..") {
			return fmt.Errorf("key %q is not a file name", k)
		}
		if err := os.WriteFile(filepath.Join(v.dir, ts, k), []byte(content), 0o444); err != nil {
			return err
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		return err
	}
	for k := range payload {
		link := filepath.Join(v.dir, k)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", k), link); err != nil {
				return err
			}
		}
	}
	return v.prune(old, payload)
}

// prune removes the previous payload directory and the symlinks of keys
// the new payload lacks.
func (v *SecretVolume) prune(old string, payload map[string]string) error {
	if old != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, old)); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(v.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if _, keep := payload[e.Name()]; keep || strings.HasPrefix(e.Name(), "..") {
			continue
		}
		if err := os.Remove(filepath.Join(v.dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// Keys lists the user-visible keys, sorted.
func (v *SecretVolume) Keys() []string {
	v.t.Helper()
	entries, err := os.ReadDir(v.dir)
	if err != nil {
		v.t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "..") {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}
