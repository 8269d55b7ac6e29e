// Command streams measures a tiergate dispatcher under many long streams:
// it starts hack/simserver and the dispatcher binary it is given (both on
// 127.0.0.1), opens --streams concurrent streaming POST
// /v1/chat/completions from --tenants tenants, reads each to its end and
// counts the errors (a status other than 200, a read error or early EOF, an
// answer without "data: [DONE]"). It samples the dispatcher's VmRSS before
// the streams, once every stream has its answer's head (all open), at its
// highest during the run, and after; KiB per stream is (peak - idle) / N.
//
//	go build -o /tmp/tg . && go run ./hack/bench/streams --tiergate /tmp/tg
//
// The run is bounded by --timeout and fails when it is reached. The
// harness's own memory (N client connections) is not the dispatcher's and
// is not counted. It raises RLIMIT_NOFILE for itself and its children.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type config struct {
	tiergate    string
	simserver   string
	streams     int
	tenants     int
	serviceTime time.Duration
	tokens      int
	timeout     time.Duration
	profile     string
}

func main() {
	var c config
	flag.StringVar(&c.tiergate, "tiergate", "", "path of the tiergate binary under test (required)")
	flag.StringVar(&c.simserver, "simserver", "", "path of a simserver binary (default: built from ./hack/simserver)")
	flag.IntVar(&c.streams, "streams", 6000, "concurrent streams")
	flag.IntVar(&c.tenants, "tenants", 6, "tenants the streams are spread over")
	flag.DurationVar(&c.serviceTime, "service-time", 20*time.Second, "length of each stream")
	flag.IntVar(&c.tokens, "tokens", 40, "SSE events per stream (spread over --service-time)")
	flag.DurationVar(&c.timeout, "timeout", 90*time.Second, "bound of the whole run")
	flag.StringVar(&c.profile, "heap-profile", "", "write the dispatcher's heap profile, taken with all streams open, to this file")
	flag.Parse()
	if c.tiergate == "" || c.streams < 1 || c.tenants < 1 {
		fmt.Fprintln(os.Stderr, "streams: --tiergate is required; --streams and --tenants must be >= 1")
		os.Exit(2)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "streams:", err)
		os.Exit(1)
	}
}

func run(c config) error {
	if err := raiseNoFile(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	tmp, err := os.MkdirTemp("", "streams-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	sim, err := startSimserver(ctx, c, tmp)
	if err != nil {
		return err
	}
	defer sim.stop()
	tg, err := startTiergate(ctx, c, tmp, sim.addr)
	if err != nil {
		return err
	}
	defer tg.stop()
	r, err := measure(ctx, c, tg)
	if err != nil {
		return err
	}
	r.print(c)
	if r.errors > 0 {
		return fmt.Errorf("%d of %d streams failed (first: %v)", r.errors, c.streams, r.firstErr)
	}
	return nil
}

// raiseNoFile lifts the soft limit on descriptors to the hard one; the
// children inherit it. Each stream costs the harness one and the
// dispatcher two.
func raiseNoFile() error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return fmt.Errorf("raise RLIMIT_NOFILE: %w", err)
	}
	return nil
}

// process is a child on 127.0.0.1, stopped with SIGTERM then SIGKILL.
type process struct {
	cmd   *exec.Cmd
	addr  string
	admin string
	token string
	done  chan struct{}
}

func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func start(name string, log string, args ...string) (*process, error) {
	out, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); out.Close(); close(p.done) }()
	return p, nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func startSimserver(ctx context.Context, c config, tmp string) (*process, error) {
	bin := c.simserver
	if bin == "" {
		bin = filepath.Join(tmp, "simserver")
		b := exec.CommandContext(ctx, "go", "build", "-o", bin, "./hack/simserver")
		b.Stdout, b.Stderr = os.Stderr, os.Stderr
		if err := b.Run(); err != nil {
			return nil, fmt.Errorf("build simserver: %w", err)
		}
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p, err := start(bin, filepath.Join(tmp, "sim.log"), "--listen", addr,
		"--concurrency", strconv.Itoa(c.streams+1000),
		"--service-time", "const:"+c.serviceTime.String(), "--tokens", strconv.Itoa(c.tokens))
	if err != nil {
		return nil, err
	}
	p.addr = addr
	return p, waitUp(ctx, p, "http://"+addr+"/health")
}

// policy admits every stream at once: slots and every limit above N.
func policy(c config, backend string) string {
	var tenants []string
	for i := range c.tenants {
		tenants = append(tenants, fmt.Sprintf(`{"id":"t%d","tier":"premium"}`, i))
	}
	n := c.streams + 1000
	return fmt.Sprintf(`{"version":1,"pool":"bench/streams","slots":%d,"serviceRate":100000,"ageingRate":6,
 "authentication":{"mode":"TrustedHeader","headerName":"X-Tenant-ID"},
 "tiers":[{"name":"premium","basePriority":0,"tolerableWaitSeconds":60,"queueBound":%d,
           "tenantConcurrencyLimit":%d,"tenantQueueLimit":%d}],
 "tenants":[%s],
 "backends":[{"address":%q,"scheme":"http"}]}`, n, n, n, n, strings.Join(tenants, ","), backend)
}

func startTiergate(ctx context.Context, c config, tmp, backend string) (*process, error) {
	pol := filepath.Join(tmp, "policy.json")
	tok := filepath.Join(tmp, "token")
	if err := os.WriteFile(pol, []byte(policy(c, backend)), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(tok, []byte("streams-token\n"), 0o600); err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	admin, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"dispatcher", "--listen", addr, "--admin-listen", admin, "--policy-file", pol}
	if c.profile != "" {
		args = append(args, "--enable-profiling", "--admin-token-file", tok)
	}
	p, err := start(c.tiergate, filepath.Join(tmp, "tiergate.log"), args...)
	if err != nil {
		return nil, err
	}
	p.addr, p.admin, p.token = addr, admin, "streams-token"
	return p, waitUp(ctx, p, "http://"+admin+"/readyz")
}

func waitUp(ctx context.Context, p *process, url string) error {
	for {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before %s answered", p.cmd.Path, url)
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", url, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type result struct {
	idle, open, peak, after int64
	errors                  int64
	firstErr                error
	openIn, total           time.Duration
}

func (r result) print(c config) {
	kib := func(b int64) float64 { return float64(b) / 1024 }
	fmt.Printf("streams=%d tenants=%d service-time=%s tokens=%d tiergate=%s\n",
		c.streams, c.tenants, c.serviceTime, c.tokens, c.tiergate)
	fmt.Printf("errors=%d all-open-after=%s run=%s\n", r.errors, r.openIn.Round(time.Millisecond), r.total.Round(time.Millisecond))
	fmt.Printf("rss-idle=%.1fMiB rss-all-open=%.1fMiB rss-peak=%.1fMiB rss-after=%.1fMiB\n",
		kib(r.idle)/1024, kib(r.open)/1024, kib(r.peak)/1024, kib(r.after)/1024)
	fmt.Printf("KiB/stream (peak-idle)/N = %.1f  (all-open-idle)/N = %.1f\n",
		kib(r.peak-r.idle)/float64(c.streams), kib(r.open-r.idle)/float64(c.streams))
}

// measure runs the streams and samples the dispatcher's RSS around them.
func measure(ctx context.Context, c config, tg *process) (result, error) {
	var r result
	pid := tg.cmd.Process.Pid
	idle, err := rss(pid)
	if err != nil {
		return r, err
	}
	r.idle = idle
	client := &http.Client{Transport: &http.Transport{
		MaxConnsPerHost:     0,
		MaxIdleConns:        c.streams,
		MaxIdleConnsPerHost: c.streams,
		DisableCompression:  true,
	}}
	var peak atomic.Int64
	peak.Store(idle)
	stopSampling := sample(pid, &peak)
	begin := time.Now()
	var opened, wg sync.WaitGroup
	opened.Add(c.streams)
	errs := make(chan error, c.streams)
	for i := range c.streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := stream(ctx, client, tg.addr, fmt.Sprintf("t%d", i%c.tenants), opened.Done); err != nil {
				errs <- err
			}
		}()
	}
	allOpen := make(chan struct{})
	go func() { opened.Wait(); close(allOpen) }()
	select {
	case <-allOpen:
		r.openIn = time.Since(begin)
		if r.open, err = rss(pid); err != nil {
			return r, err
		}
		if c.profile != "" {
			if err := heapProfile(tg, c.profile); err != nil {
				fmt.Fprintln(os.Stderr, "streams: heap profile:", err)
			}
		}
	case <-ctx.Done():
	}
	wg.Wait()
	r.total = time.Since(begin)
	stopSampling()
	r.peak = peak.Load()
	close(errs)
	for err := range errs {
		if r.errors == 0 {
			r.firstErr = err
		}
		r.errors++
	}
	if ctx.Err() != nil {
		return r, fmt.Errorf("run not done within the timeout (%d errors so far, first %v)", r.errors, r.firstErr)
	}
	client.CloseIdleConnections()
	time.Sleep(time.Second)
	r.after, err = rss(pid)
	return r, err
}

// sample keeps the highest VmRSS of pid in peak, every 200 ms, until the
// returned function is called.
func sample(pid int, peak *atomic.Int64) func() {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if v, err := rss(pid); err == nil && v > peak.Load() {
				peak.Store(v)
			}
		}
	}()
	return func() { close(done); <-stopped }
}

var body = []byte(`{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"stream":true}`)

// stream sends one streaming request as tenant and reads it to the end;
// opened is called once, when the answer's head or a failure arrives.
func stream(ctx context.Context, client *http.Client, addr, tenant string, opened func()) error {
	var once sync.Once
	open := func() { once.Do(opened) }
	defer open()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant-ID", tenant)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	open()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("after %d bytes: %w", len(b), err)
	}
	if !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) {
		return errors.New("answer ends without data: [DONE]")
	}
	return nil
}

func heapProfile(tg *process, path string) error {
	req, err := http.NewRequest(http.MethodGet, "http://"+tg.admin+"/debug/pprof/heap", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+tg.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// rss is VmRSS of pid in bytes.
func rss(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
