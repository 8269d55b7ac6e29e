package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// poolRun is the pool of config/samples on this cluster: the tiergate
// controller, two dispatcher processes on their pods' addresses, and
// watches over the policies they hold and the model pods' deletions.
type poolRun struct {
	ns  string
	ctl *testutil.Process
	ds  []*testutil.Dispatcher
	w   *policyWatch
	// dels notes the model pods' deletions from the start on.
	dels *deletionWatch
	// before are how many policies each dispatcher had applied when the
	// pool first held 6 Ready replicas.
	before []int
}

// edit changes one document of config/samples before it is applied.
type edit func(t *testing.T, doc string) string

// startPool applies config/samples (each document through edits) and
// config/dispatcher in a new namespace, with the controller and the
// dispatcher processes, and waits until the pool and the dispatchers hold
// 6 Ready model pods.
func startPool(t *testing.T, edits ...edit) *poolRun {
	t.Helper()
	p := &poolRun{ns: newNamespace(t)}
	token := filepath.Join(t.TempDir(), "push-token")
	if err := os.WriteFile(token, []byte("cluster-e2e-push-token-0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	adminPort, dataPort := dispatcherPorts(t)
	p.ctl = startController(t, token)

	started := startStep(t)
	kubectl.MustInput(t, samples(t, adminPort, edits...), "apply", "-n", p.ns, "-f", "-")
	kubectl.Must(t, "apply", "-n", p.ns, "-k", filepath.Join(repoRoot, "config", "dispatcher"))
	p.ds = startDispatchers(t, p.ns, 2, adminPort, dataPort, token)
	started.done("2 dispatcher processes on their pods' addresses")
	p.w = watchPolicies(t, p.ds)
	p.dels = watchDeletions(t, p.ns)
	awaitFollow(t, p.ns, p.w, 6, 30*time.Second)
	started.done("6 model pods Ready; pool and dispatchers hold 6 x 4 slots")
	p.w.forget() // the start-up, before the first Ready pods, is not checked
	p.before = make([]int, len(p.ds))
	for i, d := range p.ds {
		p.before[i] = len(applies(t, d))
	}
	return p
}

// logs are the policies each dispatcher applied since the pool first held
// 6 Ready replicas.
func (p *poolRun) logs(t *testing.T) [][]applied {
	t.Helper()
	out := make([][]applied, len(p.ds))
	for i, d := range p.ds {
		out[i] = applies(t, d)[p.before[i]:]
	}
	return out
}

// pool is the ModelPool.
func (p *poolRun) pool(t *testing.T) *v1alpha1.ModelPool {
	t.Helper()
	var mp v1alpha1.ModelPool
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: p.ns, Name: "llm"}, &mp); err != nil {
		t.Fatal(err)
	}
	return &mp
}

// readyCondition is the pool's Ready condition as "Status/Reason".
func readyCondition(mp *v1alpha1.ModelPool) string {
	c := meta.FindStatusCondition(mp.Status.Conditions, "Ready")
	if c == nil {
		return "none"
	}
	return string(c.Status) + "/" + c.Reason
}

// policies are the policies the dispatchers hold now.
func (p *poolRun) policies(t *testing.T) []*policy.Policy {
	t.Helper()
	var out []*policy.Policy
	for _, d := range p.ds {
		pol, err := appliedPolicy(d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pol)
	}
	return out
}

// modelAddr is a model pod's backend address.
func modelAddr(ip string) string { return net.JoinHostPort(ip, strconv.Itoa(podNet.Port())) }

// withPoolField adds a line to the ModelPool's spec (after
// concurrencyPerReplica), e.g. "coldStart: 10s".
func withPoolField(line string) edit {
	return func(t *testing.T, doc string) string {
		if !strings.Contains(doc, "kind: ModelPool") {
			return doc
		}
		return replaceOnce(t, doc, "  concurrencyPerReplica: 4\n", "  concurrencyPerReplica: 4\n  "+line+"\n")
	}
}

// withDeploymentSpec adds lines (indented as the Deployment's spec fields)
// after the model Deployment's replicas.
func withDeploymentSpec(lines string) edit {
	return func(t *testing.T, doc string) string {
		if !strings.Contains(doc, "kind: Deployment") {
			return doc
		}
		return replaceOnce(t, doc, "  replicas: 6\n", "  replicas: 6\n"+lines)
	}
}

// tierOf is the tier named name of p.
func tierOf(t *testing.T, p *policy.Policy, name string) policy.Tier {
	t.Helper()
	i := slices.IndexFunc(p.Tiers, func(tr policy.Tier) bool { return tr.Name == name })
	if i < 0 {
		t.Fatalf("policy v%d has no tier %q", p.Version, name)
	}
	return p.Tiers[i]
}

// describePolicy is a policy's slots, backends and tiers' bounds.
func describePolicy(p *policy.Policy) string {
	var tiers []string
	for _, tr := range p.Tiers {
		tiers = append(tiers, fmt.Sprintf("%s bound %d tenant queue %d", tr.Name, tr.QueueBound, tr.TenantQueueLimit))
	}
	return fmt.Sprintf("v%d %d slots, %d backends, coldStartSeconds %g, %s", p.Version, p.Slots, len(p.Backends), p.ColdStartSeconds, strings.Join(tiers, ", "))
}
