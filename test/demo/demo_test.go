package demo

import (
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// summary is the part of hack/demo's summary.json the tests check.
type summary struct {
	Interrupted bool    `json:"interrupted"`
	Error       string  `json:"error"`
	LoadSeconds float64 `json:"loadSeconds"`
	Replicas    int32   `json:"replicas"`
	Processes   int     `json:"processes"`
	Charts      []string
	Tiers       []struct {
		Tier                 string             `json:"tier"`
		Requests             int                `json:"requests"`
		Served               int                `json:"served"`
		Refused              int                `json:"refused"`
		RefusedByCause       map[string]int     `json:"refusedByCause"`
		Cut                  int                `json:"cut"`
		Dispatched           int                `json:"dispatched"`
		WaitP50              float64            `json:"waitP50Seconds"`
		WaitP95              float64            `json:"waitP95Seconds"`
		ServerOK             float64            `json:"serverOK"`
		ServerRefusedByCause map[string]float64 `json:"serverRefusedByCause"`
		ServerWaitCount      float64            `json:"serverWaitCount"`
	} `json:"tiers"`
	Streams []struct {
		Name           string         `json:"name"`
		Requests       int            `json:"requests"`
		Served         int            `json:"served"`
		RefusedByCause map[string]int `json:"refusedByCause"`
	} `json:"streams"`
	ScaleEvents []struct {
		AtSeconds      float64        `json:"atSeconds"`
		From           int32          `json:"from"`
		To             int32          `json:"to"`
		Command        string         `json:"command"`
		SpecReplicas   int32          `json:"specReplicas"`
		ReplicasOwners []string       `json:"replicasOwners"`
		Pods           []string       `json:"pods"`
		Ready          bool           `json:"ready"`
		ReadyAfter     float64        `json:"readyAfterSeconds"`
		SlotsBefore    int            `json:"slotsBefore"`
		SlotsAfter     int            `json:"slotsAfter"`
		BoundsBefore   map[string]int `json:"boundsBefore"`
		BoundsAfter    map[string]int `json:"boundsAfter"`
		Followed       bool           `json:"followed"`
		FollowedAfter  float64        `json:"followedAfterSeconds"`
		StatusFollowed bool           `json:"statusFollowed"`
		ServiceTiers   string         `json:"serviceTiers"`
	} `json:"scaleEvents"`
	Jobs struct {
		Admitted, Dispatched, Abandoned, Expired, Drained uint64
	} `json:"jobs"`
	JobsIdle bool `json:"jobsIdle"`
	OpenAI   struct {
		Calls              int `json:"calls"`
		Attempts           int `json:"attempts"`
		Succeeded          int `json:"succeeded"`
		RetriesAfterHeader int `json:"retriesAfterRetryAfter"`
		Honoured           int `json:"honoured"`
	} `json:"openai"`
	Budget  *budgetSummary  `json:"budget"`
	Zero    *zeroSummary    `json:"zero"`
	Fair    *fairSummary    `json:"fairness"`
	Cluster *clusterSummary `json:"cluster"`
}

// clusterSummary is what ran around the API server, in summary.json.
type clusterSummary struct {
	Components []struct {
		Name, Binary, Version string
		Pid                   int
	} `json:"components"`
	Controllers          []string `json:"controllers"`
	Nodes                []string `json:"nodes"`
	PodCIDR              string   `json:"podCIDR"`
	ColdStart            float64  `json:"coldStartSeconds"`
	Termination          float64  `json:"terminationDelaySeconds"`
	SimserverConcurrency int      `json:"simserverConcurrency"`
	ReplicasOwners       []string `json:"replicasOwners"`
	StatusWriters        []string `json:"statusWriters"`
	ModelPods            []struct {
		Name          string   `json:"name"`
		IP            string   `json:"ip"`
		Node          string   `json:"node"`
		Owner         string   `json:"owner"`
		ReadyAt       *float64 `json:"readySeconds"`
		StatusWriters []string `json:"statusWriters"`
		SpecWriters   []string `json:"specWriters"`
	} `json:"modelPods"`
	Addresses []struct {
		IP       string   `json:"ip"`
		Pods     []string `json:"pods"`
		Accepted int64
		Received int64
	} `json:"addresses"`
}

// fairSummary is the token-fairness phase of summary.json.
type fairSummary struct {
	Tier        string  `json:"tier"`
	PatchedAt   float64 `json:"patchedAtSeconds"`
	SwitchedAt  float64 `json:"switchedAtSeconds"`
	LoadEnd     float64 `json:"loadEndSeconds"`
	ModeSeconds float64 `json:"modeSeconds"`
	Dispatchers int     `json:"dispatchers"`
	Switched    int     `json:"switchedDispatchers"`
	Tenants     []struct {
		Tenant       string `json:"tenant"`
		PromptTokens int64  `json:"promptTokens"`
		Cost         int64  `json:"cost"`
	} `json:"tenants"`
	Requests int            `json:"requests"`
	OK       int            `json:"ok"`
	NotOK    map[string]int `json:"notOK"`
	Modes    []struct {
		Mode       string  `json:"mode"`
		JainTokens float64 `json:"jainTokens"`
		Tenants    []struct {
			Tenant         string  `json:"tenant"`
			Requests       int     `json:"requests"`
			WeightedTokens float64 `json:"weightedTokens"`
			Share          float64 `json:"share"`
			WaitP50        float64 `json:"waitP50Seconds"`
			WaitP99        float64 `json:"waitP99Seconds"`
		} `json:"tenants"`
	} `json:"modes"`
	GapMax   float64 `json:"gapMax"`
	GapBound float64 `json:"gapBound"`
	// GapBoundMetric is the dispatchers' own tiergate_fairness_gap_bound_tokens.
	GapBoundMetric float64                                       `json:"gapBoundMetric"`
	GapSamples     int                                           `json:"gapSamples"`
	Served         map[string]struct{ Prompt, Completion int64 } `json:"servedBySimservers"`
	Usage          map[string]struct{ Prompt, Completion int64 } `json:"usageOfAnswers"`
	Jobs           struct {
		Admitted, Dispatched, Abandoned, Expired, Drained uint64
		Idle                                              bool
	} `json:"jobs"`
}

// budgetSummary is the tenant over its tokens budget in summary.json.
type budgetSummary struct {
	Tenant             string   `json:"tenant"`
	Tier               string   `json:"tier"`
	TokensPerMinute    int64    `json:"tokensPerMinute"`
	PerDispatcher      []int64  `json:"perDispatcher"`
	Calls              int      `json:"calls"`
	Succeeded          int      `json:"succeeded"`
	Attempts           int      `json:"attempts"`
	RateLimited        int      `json:"rateLimited"`
	NoRetry            int      `json:"noRetry"`
	RetriesAfterHeader int      `json:"retriesAfterRetryAfter"`
	Honoured           int      `json:"honoured"`
	Answered           int      `json:"answered"`
	WithHeaders        int      `json:"withHeaders"`
	Bare               []string `json:"bareAnswers"`
	Lost               []string `json:"lostAttempts"`
	Failures           []string `json:"failures"`
	PromptTokens       int64    `json:"promptTokens"`
	CompletionTokens   int64    `json:"completionTokens"`
	SpanSeconds        float64  `json:"spanSeconds"`
	AllowedTokens      int64    `json:"allowedTokens"`
	Within             bool     `json:"withinBudget"`
	BeyondBurst        float64  `json:"beyondBurstPerMinute"`
}

// zeroSummary is the scale-from-zero phase of summary.json.
type zeroSummary struct {
	ColdStartSeconds float64 `json:"coldStartSeconds"`
	HeldFromSeconds  float64 `json:"heldFromSeconds"`
	HeldToSeconds    float64 `json:"heldToSeconds"`
	DesiredReplicas  int32   `json:"desiredReplicas"`
	Held             int     `json:"held"`
	Served           int     `json:"served"`
	Refused          int     `json:"refused"`
	Tiers            []struct {
		Tier           string         `json:"tier"`
		BoundAtZero    int            `json:"boundAtZero"`
		MaxWaitAtZero  float64        `json:"maxWaitAtZeroSeconds"`
		Sent           int            `json:"sent"`
		Held           int            `json:"held"`
		Served         int            `json:"served"`
		Expired        int            `json:"expired"`
		Refused        int            `json:"refused"`
		RefusedByCause map[string]int `json:"refusedByCause"`
		RetryAfter     int            `json:"retryAfterSeconds"`
		WaitMin        float64        `json:"waitMinSeconds"`
		WaitMax        float64        `json:"waitMaxSeconds"`
		UntilReplica   float64        `json:"untilReplicaMaxSeconds"`
		WithinMaxWait  bool           `json:"withinMaxWait"`
	} `json:"tiers"`
	ScaleEvents []struct {
		From           int32          `json:"from"`
		To             int32          `json:"to"`
		SlotsAfter     int            `json:"slotsAfter"`
		BoundsAfter    map[string]int `json:"boundsAfter"`
		Followed       bool           `json:"followed"`
		StatusFollowed bool           `json:"statusFollowed"`
	} `json:"scaleEvents"`
	ServiceTiers string `json:"serviceTiersAtZero"`
	Jobs         struct {
		Admitted, Dispatched, Abandoned, Expired, Drained uint64
		Idle                                              bool
	} `json:"jobs"`
}

func readSummary(t *testing.T, dir string) summary {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("summary.json: %v", err)
	}
	return s
}

// The seed's worked example (config/samples): pool-wide queue bounds at 6
// and at 3 ready replicas, summed over the two dispatchers' equal shares.
var (
	fullBounds = map[string]int{"premium": 20, "standard": 80, "free": 120}
	halfBounds = map[string]int{"premium": 10, "standard": 40, "free": 60}
)

// processesStarted: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, kwok, the controller, 2 dispatchers and the simserver
// behind every model pod.
const processesStarted = 9

func TestShortDemo(t *testing.T) {
	start := time.Now()
	r := startDemo(t, "30s", false)
	if code := r.wait(t, 4*time.Minute); code != 0 {
		t.Fatalf("the demo exited with %d, want 0", code)
	}
	t.Logf("the short demo took %s", time.Since(start).Round(time.Second))
	waitNoSurvivors(t, r, processesStarted)
	out := r.Output()

	// The live table, refreshed every second through the load and grace.
	if n := strings.Count(out, "tiergate demo  "); n < 28 {
		t.Errorf("the table was shown %d times, want at least 28 (every second of the 30s load)", n)
	}
	for _, want := range []string{
		"kubectl apply -n default -f config/samples",
		"TIER  QUEUED  BOUND  TENANT CAP  IN FLIGHT  SLOT SHARE  WAIT p50  WAIT p95  SERVED  OPEN  429 capacity  429 tenant_limit  429 rate_limited  504 queue_timeout  other",
		"tenant wayne has a budget of 1800 tokens a minute (Local mode: 900 + 900 at the dispatchers)",
		"kubectl apply -n default -k config/dispatcher",
		"kube-controller-manager (Kubernetes v1.",
		"kwok (kwok version v0.8.0",
		"scale 6→3: kubectl -n default scale deployment llm --replicas=3",
		"queue bounds premium 20→10, standard 80→40, free 120→60",
		"scale 3→6: kubectl -n default scale deployment llm --replicas=6",
		"queue bounds premium 10→20, standard 40→80, free 60→120",
		fmt.Sprintf("all %d processes stopped; none left", processesStarted),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q", want)
		}
	}

	if strings.Contains(out, "killed leftovers") || strings.Contains(out, "ignored SIGTERM") {
		t.Error("the demo's orderly stop left processes it had to kill")
	}

	s := readSummary(t, r.report)
	if s.Interrupted || s.Error != "" || s.LoadSeconds != 30 || s.Processes != processesStarted {
		t.Errorf("summary: interrupted %v, error %q, load %vs, processes %d", s.Interrupted, s.Error, s.LoadSeconds, s.Processes)
	}
	var tiers []string
	totalRefused := 0
	for _, tier := range s.Tiers {
		tiers = append(tiers, tier.Tier)
		totalRefused += tier.Refused
		if tier.Served == 0 || tier.Dispatched == 0 {
			t.Errorf("tier %s: served %d, dispatched %d; want both > 0", tier.Tier, tier.Served, tier.Dispatched)
		}
		// The client and the dispatchers count 429s alike, cause by cause.
		for _, cause := range []string{"capacity", "tenant_limit", "rate_limited"} {
			if c, sv := tier.RefusedByCause[cause], tier.ServerRefusedByCause[cause]; float64(c) != sv {
				t.Errorf("tier %s: %s refusals: client %d, dispatchers' metrics %v", tier.Tier, cause, c, sv)
			}
		}
		// Requests cut at the end may be counted by either side.
		if d := math.Abs(tier.ServerOK - float64(tier.Served)); d > float64(tier.Cut) {
			t.Errorf("tier %s: served %d client-side, %v 200s server-side, only %d cut", tier.Tier, tier.Served, tier.ServerOK, tier.Cut)
		}
		if tier.WaitP50 > tier.WaitP95 || tier.WaitP95 > 30 {
			t.Errorf("tier %s: wait p50 %vs, p95 %vs", tier.Tier, tier.WaitP50, tier.WaitP95)
		}
	}
	if diff := cmp.Diff([]string{"premium", "standard", "free"}, tiers); diff != "" {
		t.Errorf("tiers (-want +got):\n%s", diff)
	}
	if totalRefused == 0 {
		t.Error("no refusal recorded")
	}
	// Every request the dispatchers queued ended exactly once, and each 504
	// the clients got is one the queues expired.
	timeouts := 0
	for _, tier := range s.Tiers {
		timeouts += tier.RefusedByCause["queue_timeout"]
	}
	if j := s.Jobs; !s.JobsIdle || j.Admitted == 0 || j.Admitted != j.Dispatched+j.Abandoned+j.Expired+j.Drained || j.Expired != uint64(timeouts) || j.Drained != 0 {
		t.Errorf("dispatcher queue totals %+v (idle %v); clients saw %d queue timeouts", j, s.JobsIdle, timeouts)
	}
	for _, st := range s.Streams {
		if st.Name == "umbrella" && st.RefusedByCause["tenant_limit"] == 0 {
			t.Errorf("the noisy tenant got no tenant_limit refusal: %+v", st)
		}
	}
	if s.OpenAI.Calls == 0 || s.OpenAI.Succeeded == 0 || s.OpenAI.Attempts < s.OpenAI.Calls || s.OpenAI.Honoured != s.OpenAI.RetriesAfterHeader {
		t.Errorf("openai-go client: %+v", s.OpenAI)
	}

	// The bounds followed both scale events, to the worked example's
	// numbers, and the controller's status agreed.
	if len(s.ScaleEvents) != 2 {
		t.Fatalf("%d scale events, want 2", len(s.ScaleEvents))
	}
	type step struct {
		From, To                int32
		SlotsBefore, SlotsAfter int
		Before, After           map[string]int
	}
	var got []step
	for _, e := range s.ScaleEvents {
		got = append(got, step{e.From, e.To, e.SlotsBefore, e.SlotsAfter, e.BoundsBefore, e.BoundsAfter})
		if !e.Followed || !e.StatusFollowed || e.FollowedAfter <= 0 || e.FollowedAfter > 10 {
			t.Errorf("scale %d→%d: followed %v after %.2fs, status followed %v", e.From, e.To, e.Followed, e.FollowedAfter, e.StatusFollowed)
		}
		if !strings.Contains(e.ServiceTiers, "BOUND") {
			t.Errorf("scale %d→%d: no kubectl get servicetiers output: %q", e.From, e.To, e.ServiceTiers)
		}
		// Through spec.replicas: the ReplicaSet controller deleted or made
		// 3 pods, and new pods counted only a cold start later.
		if want := fmt.Sprintf("kubectl -n default scale deployment llm --replicas=%d", e.To); e.Command != want || e.SpecReplicas != e.To || len(e.Pods) != 3 || !e.Ready {
			t.Errorf("scale %d→%d: command %q, spec.replicas %d after, pods %v, ready %v", e.From, e.To, e.Command, e.SpecReplicas, e.Pods, e.Ready)
		}
		if diff := cmp.Diff([]string{"kubectl/scale"}, e.ReplicasOwners); diff != "" {
			t.Errorf("scale %d→%d: owners of spec.replicas right after (-want +got):\n%s", e.From, e.To, diff)
		}
		if e.To > e.From && s.Cluster != nil && e.ReadyAfter < s.Cluster.ColdStart {
			t.Errorf("scale %d→%d: ready %.2fs after the command, before the %vs cold start", e.From, e.To, e.ReadyAfter, s.Cluster.ColdStart)
		}
		t.Logf("scale %d→%d: Deployment ready %.2fs and bounds followed %.2fs after kubectl scale", e.From, e.To, e.ReadyAfter, e.FollowedAfter)
	}
	want := []step{{6, 3, 24, 12, fullBounds, halfBounds}, {3, 6, 12, 24, halfBounds, fullBounds}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("scale events (-want +got):\n%s", diff)
	}
	if e := s.ScaleEvents; math.Abs(e[0].AtSeconds-10) > 1.5 || math.Abs(e[1].AtSeconds-20) > 1.5 {
		t.Errorf("scale events at %.1fs and %.1fs, want about 10s and 20s", e[0].AtSeconds, e[1].AtSeconds)
	}

	checkCluster(t, s.Cluster)
	checkBudget(t, s)
	checkZero(t, s.Zero)
	checkFair(t, s.Fair)
	checkMarkdown(t, r.report, s)
	checkCharts(t, r.report, s.Charts)
}

// checkBudget checks the tenant over its tokens budget (1,800 a minute,
// 900 at each dispatcher in Local mode; its requests reserve about 600,
// so a bucket holds one and refills one every 40 s): its three openai-go
// workers run into it at once, are refused with 429 rate_limited (never
// with x-should-retry: false, as a request fits a part), retry after
// Retry-After as the SDK does, and every answer carries the
// x-ratelimit-* headers. Its answers used no more tokens than a token
// bucket of its budget admits from its first request to its last
// answer: the full buckets plus their refill. Only it has a budget, so
// its tier's rate_limited refusals are its own, and the dispatchers
// counted as many (checked with the other causes).
func checkBudget(t *testing.T, s summary) {
	t.Helper()
	b := s.Budget
	if b == nil {
		t.Fatal("summary.json has no budget stream")
	}
	if b.Tenant != "wayne" || b.Tier != "standard" || b.TokensPerMinute != 1800 || !cmp.Equal(b.PerDispatcher, []int64{900, 900}) {
		t.Errorf("budget stream: tenant %s tier %s, budget %d split %v; want wayne, standard, 1800 as 900 + 900", b.Tenant, b.Tier, b.TokensPerMinute, b.PerDispatcher)
	}
	if b.RateLimited == 0 || b.NoRetry != 0 || b.RetriesAfterHeader == 0 || b.Honoured != b.RetriesAfterHeader {
		t.Errorf("budget stream: %d rate_limited (%d x-should-retry: false), %d retries after Retry-After, %d honoured; want refusals, retries, all honoured, none never-retry",
			b.RateLimited, b.NoRetry, b.RetriesAfterHeader, b.Honoured)
	}
	// An attempt the demo's end cut got no answer, so no headers; every
	// other attempt was answered.
	if b.Succeeded == 0 || b.Answered == 0 || b.WithHeaders != b.Answered || len(b.Bare)+len(b.Lost) != 0 {
		t.Errorf("budget stream: %d of %d calls succeeded, %d of %d answers carried x-ratelimit-*; without them %q; unanswered %q; failed calls %q",
			b.Succeeded, b.Calls, b.WithHeaders, b.Answered, b.Bare, b.Lost, b.Failures)
	}
	used := b.PromptTokens + b.CompletionTokens
	if want := int64(float64(b.TokensPerMinute) * (1 + b.SpanSeconds/60)); !b.Within || used > b.AllowedTokens || b.AllowedTokens != want {
		t.Errorf("budget stream used %d tokens in %.1fs; its budget admits %d (reported %d, within %v)", used, b.SpanSeconds, want, b.AllowedTokens, b.Within)
	}
	// The same, as a rate: beyond the full buckets, no more than the
	// budget a minute.
	if b.BeyondBurst > float64(b.TokensPerMinute) {
		t.Errorf("budget stream: %.0f tokens a minute beyond its full buckets, over its %d", b.BeyondBurst, b.TokensPerMinute)
	}
	var tier int
	for _, tr := range s.Tiers {
		if tr.Tier == b.Tier {
			tier = tr.RefusedByCause["rate_limited"]
		}
	}
	if tier != b.RateLimited {
		t.Errorf("tier %s has %d rate_limited refusals, the budget stream %d: another tenant was rate limited", b.Tier, tier, b.RateLimited)
	}
	t.Logf("budget stream: %d calls, %d attempts, %d rate_limited, %d retries after Retry-After; %d answered; used %d of the %d tokens its budget admits in %.1fs (%.0f a minute beyond its full buckets); failed calls %q",
		b.Calls, b.Attempts, b.RateLimited, b.RetriesAfterHeader, b.Answered, used, b.AllowedTokens, b.SpanSeconds, b.BeyondBurst, b.Failures)
}

// checkZero checks the scale-from-zero phase: the pool at 0 with a cold
// start of 8s held standard and free within their bounds at zero (8 and
// 14 pool-wide: ⌊2/3 × (20s − 8s)⌋ and ⌊2/3 × (30s − 8s)⌋), refused
// premium at once with Retry-After 8, and served every held request
// after the first replica came, within the maxWait at zero.
func checkZero(t *testing.T, z *zeroSummary) {
	t.Helper()
	if z == nil {
		t.Fatal("summary.json has no scale-from-zero phase")
	}
	var steps []string
	for _, e := range z.ScaleEvents {
		steps = append(steps, fmt.Sprintf("%d→%d slots %d followed %v status %v", e.From, e.To, e.SlotsAfter, e.Followed, e.StatusFollowed))
	}
	want := []string{"6→0 slots 0 followed true status true", "0→1 slots 4 followed true status true", "1→6 slots 24 followed true status true"}
	if diff := cmp.Diff(want, steps); diff != "" {
		t.Errorf("scale events of the phase (-want +got):\n%s", diff)
	}
	// Held from the policy at zero to the first replica's: now that kwok
	// plays the cold start, at least about the cold start, and no more
	// than it plus the controllers' and the scale-up's few seconds.
	if held := z.HeldToSeconds - z.HeldFromSeconds; z.ColdStartSeconds != 8 || held < z.ColdStartSeconds-1 || held > z.ColdStartSeconds+3 {
		t.Errorf("held from %.2fs to %.2fs with a cold start of %vs; want held for the cold start to 3s more", z.HeldFromSeconds, z.HeldToSeconds, z.ColdStartSeconds)
	}
	if z.Held == 0 || z.Served == 0 || z.Refused == 0 || z.DesiredReplicas < 1 {
		t.Errorf("held %d, served %d, refused %d, desiredReplicas %d: want all > 0", z.Held, z.Served, z.Refused, z.DesiredReplicas)
	}
	atZero := map[string]string{}
	for _, tier := range z.Tiers {
		atZero[tier.Tier] = fmt.Sprintf("bound %d maxWait %v", tier.BoundAtZero, tier.MaxWaitAtZero)
		if tier.BoundAtZero == 0 {
			if n := tier.RefusedByCause["unavailable"]; n == 0 || n != tier.Sent || tier.RetryAfter != 8 || tier.Held != 0 {
				t.Errorf("tier %s at zero: %d sent, %d held, 503s %d with Retry-After %d; want every one refused at once after 8s", tier.Tier, tier.Sent, tier.Held, n, tier.RetryAfter)
			}
			continue
		}
		if tier.Held == 0 || tier.Served != tier.Held-tier.Expired || tier.Expired != 0 || !tier.WithinMaxWait {
			t.Errorf("tier %s at zero: held %d served %d expired %d within maxWait %v", tier.Tier, tier.Held, tier.Served, tier.Expired, tier.WithinMaxWait)
		}
		// Held until the first replica's policy at least, and no longer
		// than their maxWait at zero.
		if tier.WaitMax > tier.MaxWaitAtZero || tier.WaitMax < tier.UntilReplica-0.5 || tier.WaitMin <= 0 {
			t.Errorf("tier %s: held waits %.2fs to %.2fs, the first replica %.2fs away at most, maxWait at zero %vs", tier.Tier, tier.WaitMin, tier.WaitMax, tier.UntilReplica, tier.MaxWaitAtZero)
		}
	}
	wantAtZero := map[string]string{"premium": "bound 0 maxWait -1", "standard": "bound 8 maxWait 107", "free": "bound 14 maxWait 167"}
	if diff := cmp.Diff(wantAtZero, atZero); diff != "" {
		t.Errorf("ServiceTiers at zero (-want +got):\n%s", diff)
	}
	if !strings.Contains(z.ServiceTiers, "BOUND") {
		t.Errorf("no kubectl get servicetiers at zero: %q", z.ServiceTiers)
	}
	if j := z.Jobs; !j.Idle || j.Admitted == 0 || j.Admitted != j.Dispatched+j.Abandoned+j.Expired+j.Drained {
		t.Errorf("the phase's queue totals %+v", j)
	}
}

// checkFair checks the token-fairness phase: lexcorp (2,000-token
// prompts) and stark (50) in the standard tier, the same max_tokens and
// as many closed-loop workers. Served by age (Requests mode), lexcorp
// gets most of the weighted tokens; by virtual token counters (Tokens
// mode, once every dispatcher holds it), about half. Every request is
// answered 200, the simservers served exactly the tokens the answers
// report, every queued request ended once, and the dispatchers' fairness
// gap stays within the largest request's cost.
func checkFair(t *testing.T, f *fairSummary) {
	t.Helper()
	if f == nil {
		t.Fatal("summary.json has no token-fairness phase")
	}
	if f.Tier != "standard" || f.Dispatchers != 2 || f.Switched != 2 || f.SwitchedAt <= f.PatchedAt || f.SwitchedAt-f.PatchedAt > 10 {
		t.Errorf("tier %s: the switch patched at %.2fs reached %d of %d dispatchers at %.2fs", f.Tier, f.PatchedAt, f.Switched, f.Dispatchers, f.SwitchedAt)
	}
	if f.Requests == 0 || f.OK != f.Requests || len(f.NotOK) != 0 {
		t.Errorf("%d of %d requests answered 200; the rest %v", f.OK, f.Requests, f.NotOK)
	}
	var prompts []int64
	for _, tn := range f.Tenants {
		prompts = append(prompts, tn.PromptTokens)
		if f.Served[tn.Tenant] != f.Usage[tn.Tenant] || f.Usage[tn.Tenant].Prompt == 0 {
			t.Errorf("%s: the simservers served %+v, the answers report %+v", tn.Tenant, f.Served[tn.Tenant], f.Usage[tn.Tenant])
		}
	}
	if diff := cmp.Diff([]int64{2000, 50}, prompts); diff != "" {
		t.Errorf("prompt tokens of lexcorp and stark (-want +got):\n%s", diff)
	}
	// The bound is lexcorp's reservation: 2,200 weighted tokens at the
	// simservers' 4 bytes a token, a little more where the dispatchers'
	// learned ratio is below 4 (the other phases' prompts are not whole
	// multiples of 4 bytes).
	if f.GapSamples == 0 || f.GapMax <= 0 || f.GapMax > f.GapBound || f.GapBound < 2200 || f.GapBound > 2300 {
		t.Errorf("fairness gap: %d samples, max %.0f, bound %.0f (want lexcorp's reservation, 2200 to 2300)", f.GapSamples, f.GapMax, f.GapBound)
	}
	if f.GapBoundMetric != f.GapBound {
		t.Errorf("the dispatchers' tiergate_fairness_gap_bound_tokens %.0f, want the largest reservation charged, %.0f", f.GapBoundMetric, f.GapBound)
	}
	if j := f.Jobs; !j.Idle || j.Admitted != uint64(f.Requests) || j.Dispatched != j.Admitted {
		t.Errorf("the phase's queue totals %+v for %d requests", j, f.Requests)
	}
	var modes []string
	for _, m := range f.Modes {
		modes = append(modes, m.Mode)
		if len(m.Tenants) != 2 || m.Tenants[0].Tenant != "lexcorp" || m.Tenants[1].Requests == 0 || m.Tenants[0].Requests == 0 {
			t.Errorf("%s mode: tenants %+v", m.Mode, m.Tenants)
			continue
		}
		share := m.Tenants[0].Share
		switch m.Mode {
		case "Requests":
			if share <= 0.75 {
				t.Errorf("Requests mode: lexcorp got %.3f of the weighted tokens, want > 0.75 (served by age)", share)
			}
		case "Tokens":
			if share < 0.35 || share > 0.65 || m.JainTokens < 0.9 {
				t.Errorf("Tokens mode: lexcorp got %.3f of the weighted tokens (jainTokens %.3f), want about half", share, m.JainTokens)
			}
		}
		t.Logf("%s mode: jainTokens %.3f; lexcorp %.3f of the weighted tokens in %d requests (wait p50 %.1fs, p99 %.1fs), stark %d requests (wait p50 %.1fs, p99 %.1fs)",
			m.Mode, m.JainTokens, share, m.Tenants[0].Requests, m.Tenants[0].WaitP50, m.Tenants[0].WaitP99, m.Tenants[1].Requests, m.Tenants[1].WaitP50, m.Tenants[1].WaitP99)
	}
	if diff := cmp.Diff([]string{"Requests", "Tokens"}, modes); diff != "" {
		t.Errorf("modes (-want +got):\n%s", diff)
	}
	t.Logf("token fairness: %d requests, all 200; switch reached %d dispatchers %.2fs after the patch; fairness gap at most %.0f of %.0f (%d samples)",
		f.Requests, f.Switched, f.SwitchedAt-f.PatchedAt, f.GapMax, f.GapBound, f.GapSamples)
}

func checkMarkdown(t *testing.T, dir string, s summary) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	wants := []string{"# tiergate demo report", "## What the numbers show", "## Scale events", "## The openai-go client", "## A tenant over its token budget", "## Scale from zero and back", "## Token fairness within a tier",
		"### 00:10", "### 00:20", "AgeingHorizonExceedsClientTimeout", "## The cluster that ran", "| kwok | kwok version v0.8.0"}
	for _, tier := range s.Tiers {
		// The per-tier row carries the summary's numbers.
		wants = append(wants, fmt.Sprintf("| %s | %d | %d | %d |", tier.Tier, tier.Requests, tier.Served, tier.Refused))
	}
	for _, c := range s.Charts {
		wants = append(wants, "]("+c+")")
	}
	for _, w := range wants {
		if !strings.Contains(md, w) {
			t.Errorf("README.md lacks %q", w)
		}
	}
}

func checkCharts(t *testing.T, dir string, charts []string) {
	t.Helper()
	if diff := cmp.Diff([]string{"queue-wait.png", "refusals.png", "queue-and-bounds.png", "scale-from-zero.png", "token-fairness.png"}, charts); diff != "" {
		t.Errorf("charts (-want +got):\n%s", diff)
	}
	for _, c := range charts {
		f, err := os.Open(filepath.Join(dir, c))
		if err != nil {
			t.Error(err)
			continue
		}
		fi, _ := f.Stat()
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Errorf("%s: %v", c, err)
			continue
		}
		b := img.Bounds()
		if b.Dx() < 800 || b.Dy() < 400 || fi.Size() < 20<<10 {
			t.Errorf("%s: %dx%d, %d bytes; want at least 800x400 and 20 KiB", c, b.Dx(), b.Dy(), fi.Size())
		}
		if n := colours(img, 64); n < 5 {
			t.Errorf("%s: only %d distinct colours: an empty chart", c, n)
		}
	}
}

// colours counts distinct colours, up to limit.
func colours(img image.Image, limit int) int {
	seen := map[[4]uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			r, g, bl, a := img.At(x, y).RGBA()
			seen[[4]uint32{r, g, bl, a}] = true
			if len(seen) >= limit {
				return len(seen)
			}
		}
	}
	return len(seen)
}

// Ctrl-C in a terminal sends SIGINT to the foreground process group: here
// `go run ./hack/demo`, as `make demo` runs it, and the demo; the demo
// stops everything it started, in order, and go exits with it.
func TestInterruptCleansUp(t *testing.T) {
	r := startDemo(t, "2m", true)
	r.waitOutput(t, "load running for 2m0s", 3*time.Minute)
	r.waitOutput(t, "tiergate demo  00:03", 30*time.Second)
	sent := time.Now()
	if err := syscall.Kill(-r.Pid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	// go run reports the demo's exit status 130 as its own exit status 1.
	if code := r.wait(t, time.Minute); code != 1 || !strings.Contains(r.Output(), "exit status 130") {
		t.Errorf("go run exited with %d after SIGINT, want 1 after the demo's exit status 130", code)
	}
	t.Logf("stopped %s after SIGINT", time.Since(sent).Round(100*time.Millisecond))
	waitNoSurvivors(t, r, processesStarted)
	out := r.Output()
	for _, want := range []string{"interrupt: stopping everything the demo started", "interrupted; everything the demo started is stopped",
		fmt.Sprintf("all %d processes stopped; none left", processesStarted)} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if strings.Contains(out, "killed leftovers") {
		t.Errorf("the demo had to kill leftovers (or its own go run parent)")
	}
	// The partial report says what it is.
	s := readSummary(t, r.report)
	if !s.Interrupted || s.Processes != processesStarted {
		t.Errorf("summary: interrupted %v, processes %d", s.Interrupted, s.Processes)
	}
	b, err := os.ReadFile(filepath.Join(r.report, "README.md"))
	if err != nil || !strings.Contains(string(b), "**The run was interrupted (Ctrl-C or SIGTERM)") {
		t.Errorf("README.md does not say the run was interrupted: %v", err)
	}
}
