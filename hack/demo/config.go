package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("bad configuration")

// config is the demo's configuration: defaults, then flags, then validate.
type config struct {
	Root        string        // repository root (holds go.mod)
	K8sBin      string        // etcd, kube-apiserver, kubectl
	Duration    time.Duration // how long load is offered
	Grace       time.Duration // after Duration: outstanding requests may finish
	Report      string        // report directory
	WorkDir     string        // binaries, logs, kubeconfig, etcd data; "" = a temp dir
	KeepWorkDir bool
	PIDFile     string        // JSON list of every process started (for tests)
	Refresh     time.Duration // table refresh period
	ServiceTime string        // simserver --service-time
	Subnet      string        // "auto" or "127.A.B": the pods' /24
	MaxRequests int           // hard cap on requests sent, all streams together
	Seed        uint64
}

func defaultConfig() config {
	return config{
		Duration:    3 * time.Minute,
		Report:      "demo-report",
		Refresh:     time.Second,
		ServiceTime: "lognormal:6s,2s",
		Subnet:      "auto",
		MaxRequests: 20000,
		Seed:        1,
	}
}

func (c *config) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.Root, "root", c.Root, "repository root (default: the directory above the working directory that holds tiergate's go.mod)")
	fs.StringVar(&c.K8sBin, "k8s-bin", c.K8sBin, "directory with etcd, kube-apiserver and kubectl (default: $KUBEBUILDER_ASSETS, else ROOT/bin/k8s)")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "how long load is offered; the pool scales 6→3 at 1/3 and back at 2/3 of it")
	fs.DurationVar(&c.Grace, "grace", c.Grace, "after --duration, how long outstanding requests may still finish (default: a third of --duration, within [5s, 20s])")
	fs.StringVar(&c.Report, "report", c.Report, "report directory (created; an existing one must be a previous demo report or empty)")
	fs.StringVar(&c.WorkDir, "workdir", c.WorkDir, "work directory for binaries, logs and control-plane data (must not exist or be empty; default: a new temporary directory)")
	fs.BoolVar(&c.KeepWorkDir, "keep-workdir", c.KeepWorkDir, "keep the work directory at the end")
	fs.StringVar(&c.PIDFile, "pid-file", c.PIDFile, "write the processes the demo started (JSON) to this file, kept current")
	fs.DurationVar(&c.Refresh, "refresh", c.Refresh, "period of the live table")
	fs.StringVar(&c.ServiceTime, "service-time", c.ServiceTime, "simserver service time distribution (the seed's 6s mean)")
	fs.StringVar(&c.Subnet, "subnet", c.Subnet, `loopback /24 kwok gives pod IPs from, "127.A.B" (not 127.0.0, whose .1 the other servers use), or "auto": a random one whose ports are free`)
	fs.IntVar(&c.MaxRequests, "max-requests", c.MaxRequests, "at most this many requests in total")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the load's arrival times and of the service times")
}

// complete fills what the defaults derive from other fields or the
// environment.
func (c *config) complete() error {
	if c.Root == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		root, err := findRoot(wd)
		if err != nil {
			return err
		}
		c.Root = root
	}
	root, err := filepath.Abs(c.Root)
	if err != nil {
		return err
	}
	c.Root = root
	if c.K8sBin == "" {
		c.K8sBin = os.Getenv("KUBEBUILDER_ASSETS")
	}
	if c.K8sBin == "" {
		c.K8sBin = filepath.Join(c.Root, "bin", "k8s")
	}
	if c.K8sBin, err = filepath.Abs(c.K8sBin); err != nil {
		return err
	}
	if c.Grace == 0 {
		c.Grace = min(max(c.Duration/3, 5*time.Second), 20*time.Second)
	}
	if c.Report, err = filepath.Abs(c.Report); err != nil {
		return err
	}
	if c.WorkDir != "" {
		if c.WorkDir, err = filepath.Abs(c.WorkDir); err != nil {
			return err
		}
	}
	return nil
}

func (c *config) validate() error {
	var errs []error
	if c.Duration < 15*time.Second || c.Duration > time.Hour {
		errs = append(errs, fmt.Errorf("%w: --duration must be within [15s, 1h], got %s", ErrConfig, c.Duration))
	}
	if c.Grace < 0 || c.Grace > 5*time.Minute {
		errs = append(errs, fmt.Errorf("%w: --grace must be within [0, 5m], got %s", ErrConfig, c.Grace))
	}
	if c.Refresh < 100*time.Millisecond || c.Refresh > time.Minute {
		errs = append(errs, fmt.Errorf("%w: --refresh must be within [100ms, 1m], got %s", ErrConfig, c.Refresh))
	}
	if c.MaxRequests < 1 {
		errs = append(errs, fmt.Errorf("%w: --max-requests must be >= 1, got %d", ErrConfig, c.MaxRequests))
	}
	if c.ServiceTime == "" {
		errs = append(errs, fmt.Errorf("%w: --service-time must not be empty", ErrConfig))
	}
	if c.Subnet != "auto" {
		if _, err := subnetIP(c.Subnet, 1); err != nil {
			errs = append(errs, err)
		} else if c.Subnet == "127.0.0" {
			// kwok hands out every host address, 127.0.0.1 too.
			errs = append(errs, fmt.Errorf("%w: --subnet 127.0.0 holds 127.0.0.1, where the API server and the simserver listen; choose another", ErrConfig))
		}
	}
	if c.Report == "" {
		errs = append(errs, fmt.Errorf("%w: --report must not be empty", ErrConfig))
	}
	return errors.Join(errs...)
}

// subnetIP returns subnet.host after checking that subnet is a loopback
// "127.A.B".
func subnetIP(subnet string, host int) (string, error) {
	ip := net.ParseIP(fmt.Sprintf("%s.%d", subnet, host))
	if ip == nil || ip.To4() == nil || strings.Count(subnet, ".") != 2 || !ip.IsLoopback() {
		return "", fmt.Errorf("%w: --subnet must look like 127.A.B (a loopback /24), got %q", ErrConfig, subnet)
	}
	return ip.String(), nil
}

// findRoot walks up from dir to the directory whose go.mod declares
// tiergate's module.
func findRoot(dir string) (string, error) {
	for d := dir; ; {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/tiergate/tiergate\n") {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("%w: no tiergate go.mod in %s or above; run the demo from the repository or pass --root", ErrConfig, dir)
		}
		d = parent
	}
}

// schedule is when things happen, relative to the start of the load.
type schedule struct {
	Load  time.Duration // load is offered in [0, Load)
	Grace time.Duration // then outstanding requests get this long
	Scale []scaleStep
}

// scaleStep sets the pool's ready replicas at a time.
type scaleStep struct {
	At       time.Duration
	Replicas int32
}

// newSchedule scales the pool from full to half at a third of the load and
// back at two thirds, so the short demo does the same, proportionally
// earlier.
func newSchedule(load, grace time.Duration, full int32) schedule {
	return schedule{
		Load:  load,
		Grace: grace,
		Scale: []scaleStep{
			{At: load / 3, Replicas: max(full/2, 1)},
			{At: 2 * load / 3, Replicas: full},
		},
	}
}
