package simulate

import (
	"bytes"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func TestMain(m *testing.M) {
	// Every Wait goroutine a run starts must have ended when Run returns.
	goleak.VerifyTestMain(m)
}

const seedDir = "../examples/simulate/seed"

func read(t testing.TB, paths ...string) *Input {
	t.Helper()
	in, err := ReadFiles(paths...)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func seedInput(t testing.TB, pool, load string) *Input {
	return read(t, filepath.Join(seedDir, pool), filepath.Join(seedDir, "tiers.yaml"),
		filepath.Join(seedDir, "quotas.yaml"), filepath.Join(seedDir, load))
}

// run simulates with the invariant checks on: after every event the
// simulator's counts must equal the queue's Stats, no tier may be over its
// bound, and no dispatch may exceed the slots or a tenant's limit.
func run(t testing.TB, in *Input) *Result {
	t.Helper()
	res, err := Run(in, Options{checkInvariants: true})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func expectBoundsHeld(t *testing.T, res *Result) {
	t.Helper()
	for name, tr := range res.Tiers {
		if tr.MaxQueued > tr.Bound {
			t.Errorf("tier %s: %d queued at most, over its bound %d", name, tr.MaxQueued, tr.Bound)
		}
	}
}

// TestSeedOverload is the seed's worked example under sustained overload:
// premium alone asks for 4.8 req/s of a pool that serves 4.
func TestSeedOverload(t *testing.T) {
	t.Run("clientTimeout above the ageing horizon: the guarantee holds", func(t *testing.T) {
		res := run(t, seedInput(t, "pool-4m.yaml", "load-overload.yaml"))
		expectBoundsHeld(t, res)
		if res.Policy.HorizonExceedsClientTimeout {
			t.Errorf("horizon %gs is within clientTimeout %gs, yet the condition is set", res.Policy.AgeingHorizonSeconds, res.Policy.ClientTimeoutSeconds)
		}
		for _, w := range res.Warnings {
			if strings.HasPrefix(w, "AgeingHorizonExceedsClientTimeout") {
				t.Errorf("unexpected warning %q", w)
			}
		}
		if u := res.Utilisation; u < 0.99 {
			t.Errorf("utilisation %.3f under sustained overload, want >= 0.99", u)
		}
		prem := res.Tiers["premium"]
		if prem.OfferedRate < res.Policy.ServiceRate {
			t.Fatalf("premium offers %g req/s, not at or above capacity %g: not the scenario", prem.OfferedRate, res.Policy.ServiceRate)
		}
		if prem.ThroughputShare < 0.5 {
			t.Errorf("premium got %.1f%% of the throughput, want most of it", 100*prem.ThroughputShare)
		}
		want := map[string]float64{"premium": 91, "standard": 151, "free": 211} // docs/architecture.md#the-queue with ΣL = 340, μ = 4, S = 6
		for name, tr := range res.Tiers {
			if tr.MaxWait != want[name] {
				t.Errorf("tier %s: stated maxWait %gs, want %gs", name, tr.MaxWait, want[name])
			}
			if tr.Served == 0 || tr.UnderLimits.Count < tr.Served/2 {
				t.Errorf("tier %s: %d served, %d of them under their tenant's limits: too few to test the guarantee", name, tr.Served, tr.UnderLimits.Count)
			}
			if !tr.UnderLimits.WithinMaxWait || tr.UnderLimits.MaxWait > tr.MaxWait {
				t.Errorf("tier %s: a request under its tenant's limits waited %gs, over the stated maxWait %gs", name, tr.UnderLimits.MaxWait, tr.MaxWait)
			}
			if tr.Expired != 0 {
				t.Errorf("tier %s: %d expired; clientTimeout is above every maxWait", name, tr.Expired)
			}
			t.Logf("%-8s served %5d  wait p95 %6.2fs  max under limits %6.2fs  stated %gs", name, tr.Served, tr.Wait.P95, tr.UnderLimits.MaxWait, tr.MaxWait)
		}
		// Ageing is what serves free: its wait is about the 120 s horizon.
		if free := res.Tiers["free"]; free.Wait.Mean < 100 {
			t.Errorf("free mean wait %gs; under premium overload it should be near the ageing horizon", free.Wait.Mean)
		}
	})

	t.Run("the seed's own 30s clientTimeout: warning, and free requests expire", func(t *testing.T) {
		res := run(t, seedInput(t, "pool.yaml", "load-overload.yaml"))
		expectBoundsHeld(t, res)
		if !res.Policy.HorizonExceedsClientTimeout {
			t.Error("the controller's AgeingHorizonExceedsClientTimeout condition is not set")
		}
		// The controller's condition message, prefixed with its type.
		want := "AgeingHorizonExceedsClientTimeout: ageing horizon 2m0s (6s per point × 20 points) exceeds clientTimeout 30s: " +
			"under sustained load of the top tier a request of the lowest tier expires before ageing lifts it, so the starvation guarantee is void"
		if !slices.Contains(res.Warnings, want) {
			t.Errorf("warnings %q\ndo not contain %q", res.Warnings, want)
		}
		var text bytes.Buffer
		if err := WriteText(&text, res); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(text.String(), "WARNING: "+want+"\n") {
			t.Errorf("the text output does not print the warning:\n%s", text.String())
		}
		free := res.Tiers["free"]
		if free.Expired <= 9*free.Served {
			t.Errorf("free: %d expired, %d served; want most to expire", free.Expired, free.Served)
		}
		if prem := res.Tiers["premium"]; prem.Expired != 0 {
			t.Errorf("premium: %d expired", prem.Expired)
		}
		t.Logf("free: %d expired, %d served", free.Expired, free.Served)
	})
}

// TestStrictPriority turns ageing effectively off (10000 h per point):
// the free tier starves, which shows that the guarantee comes from ageing.
// Premium offers 9.6 req/s here (2.4 times the pool), so its queue never
// empties and even a momentary gap cannot let a free request through; the
// same load with the seed's ageing serves free.
func TestStrictPriority(t *testing.T) {
	tests := map[string]struct {
		rate       time.Duration // 0: the seed's starvationBound
		wantServed bool
	}{
		"ageing off":        {rate: 10000 * time.Hour, wantServed: false},
		"the seed's ageing": {wantServed: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := seedInput(t, "pool-4m.yaml", "load-overload.yaml")
			for i := range in.Load.Spec.Tenants {
				if a := &in.Load.Spec.Tenants[i].Arrival; a.Process == ProcPoisson {
					a.Rate *= 2
				}
			}
			if tc.rate > 0 {
				in.Pool.Spec.Ageing = v1alpha1.Ageing{Rate: &metav1.Duration{Duration: tc.rate}}
			}
			res := run(t, in)
			expectBoundsHeld(t, res)
			free, prem := res.Tiers["free"], res.Tiers["premium"]
			if tc.wantServed {
				if free.Served == 0 || free.Expired != 0 {
					t.Errorf("free: %d served, %d expired; ageing should serve every free request", free.Served, free.Expired)
				}
			} else {
				if free.Served != 0 || res.Tiers["standard"].Served != 0 {
					t.Errorf("free served %d, standard %d under strict priority with premium overload, want 0", free.Served, res.Tiers["standard"].Served)
				}
				if free.Expired == 0 {
					t.Errorf("free: nothing expired; its requests should wait out the 4m clientTimeout")
				}
				if prem.Throughput < 0.97*res.Policy.ServiceRate {
					t.Errorf("premium throughput %g, want the whole pool (%g)", prem.Throughput, res.Policy.ServiceRate)
				}
			}
			t.Logf("free %d served, %d expired; premium %.3f req/s", free.Served, free.Expired, prem.Throughput)
		})
	}
}

// TestNoisyNeighbour: one tenant floods its tier at 2.5 times the pool's
// capacity. Its concurrency cap (a quarter of the pool) and tenant queue
// limit keep the other tenants' p95 wait where it was without the flood.
// Stated tolerance: each other tenant's p95 rises by at most 0.5 s (a
// twelfth of the mean service time) and its mean by at most 0.1 s. This
// holds while the others' load fits in the pool minus the flood's cap
// (here 9.6 of 18 slots). Every tenant has its own random stream, so the
// others' traffic is identical in every run.
func TestNoisyNeighbour(t *testing.T) {
	const tolerance, meanTolerance = 0.5, 0.1 // seconds
	others := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	variant := func(flood bool, share string) *Result {
		in := read(t, "testdata/noisy.yaml")
		if !flood {
			in.Load.Spec.Tenants = slices.DeleteFunc(in.Load.Spec.Tenants, func(tl TenantLoad) bool { return tl.Tenant == "hog" })
		}
		in.Tiers[0].Spec.TenantShare = resource.MustParse(share)
		return run(t, in)
	}
	base := variant(false, "0.25")
	flood := variant(true, "0.25")
	uncapped := variant(true, "1")
	expectBoundsHeld(t, flood)

	if hog := flood.Tenants["hog"]; hog.Refused.TenantLimit == 0 || hog.Throughput > 1.01 {
		t.Errorf("hog: %d tenant_limit refusals, %g req/s served; want refusals and at most its 6 slots (1 req/s)", hog.Refused.TenantLimit, hog.Throughput)
	}
	for _, name := range others {
		b, f, u := base.Tenants[name], flood.Tenants[name], uncapped.Tenants[name]
		if b.Offered != f.Offered {
			t.Fatalf("tenant %s offered %d without the flood and %d with it: the runs do not share its traffic", name, b.Offered, f.Offered)
		}
		if f.Wait.P95 > b.Wait.P95+tolerance {
			t.Errorf("tenant %s: p95 wait %.3fs with the flood, %.3fs without; more than %gs apart", name, f.Wait.P95, b.Wait.P95, tolerance)
		}
		if f.Wait.Mean > b.Wait.Mean+meanTolerance {
			t.Errorf("tenant %s: mean wait %.3fs with the flood, %.3fs without; more than %gs apart", name, f.Wait.Mean, b.Wait.Mean, meanTolerance)
		}
		if f.Refused != (Refused{}) {
			t.Errorf("tenant %s refused %+v during the flood", name, f.Refused)
		}
		// Contrast: without an effective cap the same flood does move them,
		// so the comparison above can fail.
		if u.Wait.P95 < b.Wait.P95+10 {
			t.Errorf("tenant %s: uncapped flood p95 %.3fs vs %.3fs; the contrast run should show the damage", name, u.Wait.P95, b.Wait.P95)
		}
		t.Logf("tenant %s p95 (p99, mean): alone %.3fs (%.3fs, %.3fs), flood capped %.3fs (%.3fs, %.3fs), flood uncapped %.3fs", name, b.Wait.P95, b.Wait.P99, b.Wait.Mean, f.Wait.P95, f.Wait.P99, f.Wait.Mean, u.Wait.P95)
	}
}

// TestLittlesLaw checks mean queue length = admission rate × mean time in
// queue, per tier, within 5%, from the simulation's own time-weighted queue
// length (equal to the schedulers' counts at every event: runKind checks
// it), for every scheduler; tiergate's runs also check its stated maxWait. The law is about a queue in steady state:
// fcfs's unbounded queue under sustained overload grows for the whole run
// and has none, so those pairs are left out (stable says which are run).
func TestLittlesLaw(t *testing.T) {
	tests := map[string]struct {
		in *Input
		// fcfs: fcfs's queue is stable here.
		fcfs bool
	}{
		"one tier at 95% load":              {in: read(t, "testdata/little.yaml"), fcfs: true},
		"seed overload with expiry":         {in: seedInput(t, "pool.yaml", "load-overload.yaml")},
		"seed overload, guarantee holding":  {in: seedInput(t, "pool-4m.yaml", "load-overload.yaml")},
		"seed at 2x, all Poisson, 30s":      {in: seedInput(t, "pool.yaml", "load-2x.yaml")},
		"small scenario with a scale-down":  {in: read(t, "../examples/simulate/small.yaml")},
		"noisy neighbour with client flood": {in: read(t, "testdata/noisy.yaml")},
		"seed tiers at 80% load":            {in: seedInput(t, "pool.yaml", "../../../simulate/testdata/load-80.yaml"), fcfs: true},
	}
	for name, tc := range tests {
		for _, kind := range append([]string{SchedTiergate}, Baselines...) {
			if kind == SchedFCFS && !tc.fcfs {
				continue
			}
			t.Run(name+"/"+kind, func(t *testing.T) {
				t.Parallel() // the runs share only their read-only input
				res := runKind(t, tc.in, kind, Options{})
				if kind == SchedTiergate {
					expectStatedMaxWait(t, res)
				}
				for tier, tr := range res.Tiers {
					q := tr.Queue
					lw := q.AdmissionRate * q.MeanTimeInQueue
					if q.MeanLength < 0.1 {
						t.Fatalf("tier %s: mean queue length %g; the scenario must queue to test anything", tier, q.MeanLength)
					}
					if rel := math.Abs(q.MeanLength-lw) / q.MeanLength; rel > 0.05 {
						t.Errorf("tier %s: mean queue length %.3f, λ×W = %.3f × %.3f = %.3f: %.1f%% apart", tier, q.MeanLength, q.AdmissionRate, q.MeanTimeInQueue, lw, 100*rel)
					}
					t.Logf("tier %-11s L = %8.3f  λW = %8.3f", tier, q.MeanLength, lw)
				}
			})
		}
	}
}

func TestDeterminism(t *testing.T) {
	jsonOf := func(seed *uint64) string {
		res, err := Run(read(t, "../examples/simulate/small.yaml"), Options{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := WriteJSON(&b, res); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	first := jsonOf(nil)
	for range 3 {
		if diff := cmp.Diff(first, jsonOf(nil)); diff != "" {
			t.Fatalf("same seed, different output (-first +again):\n%s", diff)
		}
	}
	seven := uint64(7) // the file's own seed
	if diff := cmp.Diff(first, jsonOf(&seven)); diff != "" {
		t.Errorf("--seed equal to the file's seed changed the output (-file +flag):\n%s", diff)
	}
	other := uint64(8)
	o := jsonOf(&other)
	if o == first {
		t.Error("a different seed gave identical output")
	}
	if !strings.Contains(o, `"seed": 8,`) {
		t.Error("the output does not report the overriding seed 8")
	}
}

// TestGoldenJSON holds each example's --json document to its golden file
// (go test ./simulate -run TestGoldenJSON -update rewrites them).
func TestGoldenJSON(t *testing.T) {
	for example, golden := range map[string]string{
		"small.yaml":   "small.json.golden",
		"budgets.yaml": "budgets.json.golden",
	} {
		t.Run(example, func(t *testing.T) {
			res := run(t, read(t, filepath.Join("../examples/simulate", example)))
			var got bytes.Buffer
			if err := WriteJSON(&got, res); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", golden)
			if *update {
				if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./simulate -run TestGoldenJSON -update)", err)
			}
			if diff := cmp.Diff(string(want), got.String()); diff != "" {
				t.Errorf("--json output (-golden +got):\n%s", diff)
			}
		})
	}
}

// BenchmarkSeedHourOverload: one simulated hour of the seed example at twice
// the pool's capacity (8 req/s offered against 4). sim-s/s is simulated
// seconds per wall-clock second: the speed-up over running it for real.
func BenchmarkSeedHourOverload(b *testing.B) {
	in := seedInput(b, "pool.yaml", "load-2x.yaml")
	var offered int64
	for b.Loop() {
		res, err := Run(in, Options{})
		if err != nil {
			b.Fatal(err)
		}
		offered = 0
		for _, tr := range res.Tiers {
			offered += tr.Offered
		}
	}
	perOp := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(in.Load.Spec.Duration.Seconds()/perOp, "sim-s/s")
	b.ReportMetric(float64(offered), "requests/op")
}
