package testutil

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// RaceEnv names the variable that asks the suites to build the binaries
// under test with the race detector.
const RaceEnv = "TIERGATE_TEST_RACE"

// RaceRequested reports whether RaceEnv is set (to anything).
func RaceRequested() bool { return os.Getenv(RaceEnv) != "" }

// ModuleRoot is the nearest directory at or above the working directory
// that holds a go.mod: for a test, the root of its module.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testutil: no go.mod at or above the working directory")
		}
		dir = parent
	}
}

// BuildOptions change how BuildBinary builds.
type BuildOptions struct {
	// Race builds with -race (and the go command's default cgo setting,
	// which the race detector's runtime wants).
	Race bool
	// Env is added to the environment of `go build` (e.g. GOWORK=off).
	Env []string
}

// releaseEnv and releaseFlags are what make build and hack/image compile
// the shipped binary with (static, trimmed). Builds without Race use them
// too, so a cold `make test` compiles the Kubernetes packages twice (the
// tests' -race build and this one), not three times; only the link of
// the release differs (-s -w and the version stamp).
var (
	releaseEnv   = []string{"CGO_ENABLED=0"}
	releaseFlags = []string{"-trimpath"}
)

// BuildBinary runs `go build -o out pkg` in dir (the module root; pkg is
// relative to it, like "./hack/simserver", or an import path). The error
// carries the compiler's output.
func BuildBinary(dir, out, pkg string, o BuildOptions) error {
	return goBuild(dir, out, []string{pkg}, o)
}

// goBuild runs one `go build -o out pkgs...` (out ends in a separator
// when there are several), holding buildLock: suites run as parallel test
// processes, and two cold builds of the same packages at once would each
// compile all of them; one after the other, the second finds them cached.
func goBuild(dir, out string, pkgs []string, o BuildOptions) error {
	args := []string{"build", "-o", out}
	env := os.Environ()
	if o.Race {
		args = append(args, "-race")
	} else {
		args = append(args, releaseFlags...)
		env = append(env, releaseEnv...)
	}
	env = append(env, o.Env...)
	unlock, err := buildLock(dir, env)
	if err != nil {
		return err
	}
	defer unlock()
	cmd := exec.Command("go", append(args, pkgs...)...)
	cmd.Dir = dir
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", strings.Join(pkgs, " "), err, b)
	}
	return nil
}

// buildLockPath is the lock file of the build cache that `go build` in
// dir with env uses: builds sharing a cache wait for each other, builds
// with different caches do not.
func buildLockPath(dir string, env []string) (string, error) {
	cmd := exec.Command("go", "env", "GOCACHE")
	cmd.Dir = dir
	cmd.Env = env
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go env GOCACHE: %w", err)
	}
	sum := sha256.Sum256(bytes.TrimSpace(b))
	return filepath.Join(os.TempDir(), "tiergate-gobuild-"+hex.EncodeToString(sum[:8])+".lock"), nil
}

// buildLock takes the exclusive lock of buildLockPath; unlock releases it
// (the kernel does when the process dies).
func buildLock(dir string, env []string) (unlock func(), err error) {
	path, err := buildLockPath(dir, env)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// Binaries are the programs the process-level suites run.
type Binaries struct {
	// Tiergate is the module's main package: controller and dispatcher.
	Tiergate string
	// Simserver is hack/simserver, the model server stand-in.
	Simserver string
}

// BuildBinaries builds Binaries into dir, in one go build, from the
// module root.
func BuildBinaries(dir string, o BuildOptions) (Binaries, error) {
	root, err := ModuleRoot()
	if err != nil {
		return Binaries{}, err
	}
	// One go build names each binary after its package: the module root's
	// main package is "tiergate".
	b := Binaries{Tiergate: filepath.Join(dir, "tiergate"), Simserver: filepath.Join(dir, "simserver")}
	if err := goBuild(root, dir+string(filepath.Separator), []string{".", "./hack/simserver"}, o); err != nil {
		return Binaries{}, err
	}
	return b, nil
}
