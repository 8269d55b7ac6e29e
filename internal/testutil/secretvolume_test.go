package testutil

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSecretVolumeLayout(t *testing.T) {
	v := NewSecretVolume(t, map[string]string{"token": "one", "ca.crt": "pem"})
	if diff := cmp.Diff([]string{"ca.crt", "token"}, v.Keys()); diff != "" {
		t.Errorf("keys (-want +got):\n%s", diff)
	}
	link, err := os.Readlink(v.Path("token"))
	if err != nil || link != filepath.Join("..data", "token") {
		t.Errorf("token is a symlink to %q (%v), want ..data/token", link, err)
	}
	first, err := os.Readlink(filepath.Join(v.Dir(), "..data"))
	if err != nil || !strings.HasPrefix(first, "..") {
		t.Fatalf("..data points at %q (%v), want a hidden directory", first, err)
	}
	if b, err := os.ReadFile(v.Path("token")); err != nil || string(b) != "one" {
		t.Errorf("token reads %q, %v", b, err)
	}

	v.Update(map[string]string{"token": "two"})
	second, _ := os.Readlink(filepath.Join(v.Dir(), "..data"))
	if second == first {
		t.Errorf("..data still points at %s after an update", first)
	}
	if _, err := os.Stat(filepath.Join(v.Dir(), first)); !os.IsNotExist(err) {
		t.Errorf("the old payload directory %s is still there (%v)", first, err)
	}
	if b, err := os.ReadFile(v.Path("token")); err != nil || string(b) != "two" {
		t.Errorf("token reads %q, %v after the update", b, err)
	}
	if diff := cmp.Diff([]string{"token"}, v.Keys()); diff != "" {
		t.Errorf("keys after dropping ca.crt (-want +got):\n%s", diff)
	}
	if _, err := os.Lstat(filepath.Join(v.Dir(), "..data_tmp")); !os.IsNotExist(err) {
		t.Errorf("..data_tmp left behind: %v", err)
	}
}

// A reader that keeps opening the key while the volume is swapped sees
// one whole payload or the other, never a mix or an empty file. It may
// see the file missing: a reader that resolved "..data" to the old
// directory just before the swap opens a file the prune has removed. The
// kubelet's AtomicWriter has the same window, which is why a token file
// follower keeps its token when a read fails.
func TestSecretVolumeSwapIsAtomic(t *testing.T) {
	v := NewSecretVolume(t, map[string]string{"token": "a"})
	var stop atomic.Bool
	var wg sync.WaitGroup
	var bad atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			b, err := os.ReadFile(v.Path("token"))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil || (string(b) != "a" && string(b) != "b") {
				bad.Store(string(b) + " " + errString(err))
				return
			}
		}
	}()
	for i := 0; i < 200; i++ {
		v.Update(map[string]string{"token": []string{"a", "b"}[i%2]})
	}
	stop.Store(true)
	wg.Wait()
	if s := bad.Load(); s != nil {
		t.Errorf("a reader saw %q during the swaps", s)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
