package testutil

import (
	"debug/buildinfo"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestModuleRoot(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	want, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if root != want {
		t.Errorf("ModuleRoot = %s, want %s", root, want)
	}
	t.Chdir(t.TempDir())
	if root, err := ModuleRoot(); err == nil {
		t.Errorf("ModuleRoot outside any module = %s, want an error", root)
	}
}

func TestRaceRequested(t *testing.T) {
	t.Setenv(RaceEnv, "")
	if RaceRequested() {
		t.Error("RaceRequested with the variable empty")
	}
	t.Setenv(RaceEnv, "1")
	if !RaceRequested() {
		t.Error("not RaceRequested with the variable set")
	}
}

func TestBuildBinary(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	const pkg = "./internal/testutil/testdata/hello"
	tests := map[string]struct {
		opts BuildOptions
		want string
	}{
		"plain":    {BuildOptions{}, "hello plain\n"},
		"with env": {BuildOptions{Env: []string{"GOFLAGS=-tags=testutilflavour"}}, "hello tagged\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "hello")
			if err := BuildBinary(root, out, pkg, tc.opts); err != nil {
				t.Fatal(err)
			}
			got, err := exec.Command(out).Output()
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("the binary says %q, want %q", got, tc.want)
			}
			// Built as the release is, so it shares the compiled packages.
			want := map[string]string{"CGO_ENABLED": "0", "-trimpath": "true"}
			if diff := cmp.Diff(want, buildSettings(t, out, "CGO_ENABLED", "-trimpath")); diff != "" {
				t.Errorf("build settings (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("race", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "hello")
		if err := BuildBinary(root, out, pkg, BuildOptions{Race: true}); err != nil {
			t.Fatal(err)
		}
		// A race build links the detector's runtime in.
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "__tsan_") {
			t.Error("the -race build has no race detector runtime")
		}
		if got := buildSettings(t, out, "-trimpath"); got["-trimpath"] != "" {
			t.Errorf("the -race build has -trimpath=%s; it takes the tests' flags, not the release's", got["-trimpath"])
		}
	})
	t.Run("a build failure carries the compiler output", func(t *testing.T) {
		err := BuildBinary(root, filepath.Join(t.TempDir(), "x"), "./internal/testutil/testdata/missing", BuildOptions{})
		if err == nil {
			t.Fatal("building a missing package succeeded")
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "go build ./internal/testutil/testdata/missing: exit status 1\n") || !strings.Contains(msg, "testdata/missing") {
			t.Errorf("error %q", msg)
		}
	})
}

func TestBuildBinaries(t *testing.T) {
	b := binaries(t)
	for name, tc := range map[string]struct {
		path, args, want string
	}{
		"tiergate":  {b.Tiergate, "dispatcher --help", "-admin-listen"},
		"simserver": {b.Simserver, "--help", "simserver: a STAND-IN for vLLM"},
	} {
		t.Run(name, func(t *testing.T) {
			out, _ := exec.Command(tc.path, strings.Fields(tc.args)...).CombinedOutput()
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("%s %s does not say %q:\n%s", tc.path, tc.args, tc.want, out)
			}
		})
	}
	t.Run("outside the module", func(t *testing.T) {
		t.Chdir(t.TempDir())
		if _, err := BuildBinaries(t.TempDir(), BuildOptions{}); err == nil {
			t.Error("BuildBinaries outside any module succeeded")
		}
	})
}

// buildSettings are the named build settings recorded in the binary.
func buildSettings(t *testing.T, bin string, keys ...string) map[string]string {
	t.Helper()
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range info.Settings {
		if slices.Contains(keys, s.Key) {
			got[s.Key] = s.Value
		}
	}
	return got
}

func TestBuildLock(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cacheA := append(os.Environ(), "GOCACHE="+t.TempDir())
	cacheB := append(os.Environ(), "GOCACHE="+t.TempDir())
	pathA, err := buildLockPath(root, cacheA)
	if err != nil {
		t.Fatal(err)
	}
	if pathB, err := buildLockPath(root, cacheB); err != nil || pathB == pathA {
		t.Errorf("two build caches share the lock %s (err %v)", pathA, err)
	}
	unlock, err := buildLock(root, cacheA)
	if err != nil {
		t.Fatal(err)
	}
	// tryLock takes and drops the lock on a descriptor of its own, as
	// another test process would.
	tryLock := func() error {
		f, err := os.Open(pathA)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}
	if err := tryLock(); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Errorf("locking a held build lock: %v, want %v", err, syscall.EWOULDBLOCK)
	}
	unlock()
	if err := tryLock(); err != nil {
		t.Errorf("locking a released build lock: %v", err)
	}
	t.Run("no go env", func(t *testing.T) {
		_, err := buildLock(root, append(os.Environ(), "GOTOOLCHAIN=bogus"))
		if err == nil || !strings.HasPrefix(err.Error(), "go env GOCACHE: ") {
			t.Errorf("buildLock with a broken go command: %v, want a go env GOCACHE error", err)
		}
	})
}
