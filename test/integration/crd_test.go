package integration

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tiergatev1alpha1 "github.com/tiergate/tiergate/api/v1alpha1"
)

// crdShape is what a CRD must look like once the API server accepted it.
type crdShape struct {
	Kind, Plural, ShortName string
	Categories              []string
	Scope                   apiextensionsv1.ResourceScope
	Versions                []string
	StatusSubresource       bool
	Columns                 []string
	Established, NamesOK    apiextensionsv1.ConditionStatus
}

func TestCRDsAreEstablished(t *testing.T) {
	t.Parallel()
	tests := map[string]crdShape{
		"modelpools.tiergate.dev": {
			Kind: "ModelPool", Plural: "modelpools", ShortName: "mp",
			Columns: []string{"DEPLOYMENT", "REPLICAS", "DESIRED", "SLOTS", "RATE", "FAIRNESS", "BOUND-BY", "TOKEN-RATE", "SYNCED", "VERSION", "READY", "AGE"},
		},
		"servicetiers.tiergate.dev": {
			Kind: "ServiceTier", Plural: "servicetiers", ShortName: "st",
			Columns: []string{"POOL", "PRIORITY", "WAIT", "SHARE", "BOUND", "TENANT-LIMIT", "TENANT-TPM", "TOKEN-BOUND", "AGE"},
		},
		"tenantquotas.tiergate.dev": {
			Kind: "TenantQuota", Plural: "tenantquotas", ShortName: "tq",
			Columns: []string{"TENANT", "TIER", "LIMIT", "RPM", "TPM", "WEIGHT", "READY", "AGE"},
		},
	}
	for name, want := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			want.Categories = []string{"tiergate"}
			want.Scope = apiextensionsv1.NamespaceScoped
			want.Versions = []string{"v1alpha1"}
			want.StatusSubresource = true
			want.Established, want.NamesOK = apiextensionsv1.ConditionTrue, apiextensionsv1.ConditionTrue

			var crd apiextensionsv1.CustomResourceDefinition
			if err := k8sClient.Get(context.Background(), client.ObjectKey{Name: name}, &crd); err != nil {
				t.Fatalf("get CRD: %v", err)
			}
			got := crdShape{
				Kind:       crd.Spec.Names.Kind,
				Plural:     crd.Spec.Names.Plural,
				Categories: crd.Spec.Names.Categories,
				Scope:      crd.Spec.Scope,
			}
			if len(crd.Spec.Names.ShortNames) == 1 {
				got.ShortName = crd.Spec.Names.ShortNames[0]
			}
			for _, v := range crd.Spec.Versions {
				if v.Served && v.Storage {
					got.Versions = append(got.Versions, v.Name)
				}
				got.StatusSubresource = v.Subresources != nil && v.Subresources.Status != nil
				for _, c := range v.AdditionalPrinterColumns {
					got.Columns = append(got.Columns, c.Name)
				}
			}
			for _, c := range crd.Status.Conditions {
				switch c.Type {
				case apiextensionsv1.Established:
					got.Established = c.Status
				case apiextensionsv1.NamesAccepted:
					got.NamesOK = c.Status
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("CRD %s (-want +got):\n%s", name, diff)
			}
		})
	}
}

func TestChartCRDsMatchBases(t *testing.T) {
	t.Parallel()
	bases, err := filepath.Glob(filepath.Join(repoRoot, "config", "crd", "bases", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(bases) != 3 {
		t.Fatalf("config/crd/bases holds %d CRDs, want 3", len(bases))
	}
	for _, b := range bases {
		want, err := os.ReadFile(b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(repoRoot, "charts", "tiergate", "crds", filepath.Base(b)))
		if err != nil {
			t.Fatalf("chart copy: %v", err)
		}
		if diff := cmp.Diff(string(want), string(got)); diff != "" {
			t.Errorf("charts/tiergate/crds/%s differs from config/crd/bases (-want +got):\n%s", filepath.Base(b), diff)
		}
	}
}

// sampleObjects are kubectl apply's names for config/samples, in file order.
var sampleObjects = []string{
	"deployment.apps/llm",
	"modelpool.tiergate.dev/llm",
	"servicetier.tiergate.dev/premium",
	"servicetier.tiergate.dev/standard",
	"servicetier.tiergate.dev/free",
	"tenantquota.tiergate.dev/acme",
	"tenantquota.tiergate.dev/globex",
	"tenantquota.tiergate.dev/initech",
}

func applyLines(verb string) string {
	var b strings.Builder
	for _, o := range sampleObjects {
		b.WriteString(o + " " + verb + "\n")
	}
	return b.String()
}

// applySamples applies config/samples into ns with the real kubectl.
func applySamples(t *testing.T, ns string) {
	t.Helper()
	stdout, stderr, err := kubectl(t, "apply", "-n", ns, "-f", "config/samples")
	if err != nil {
		t.Fatalf("kubectl apply -f config/samples: %v\nstderr: %s", err, stderr)
	}
	if diff := cmp.Diff(applyLines("created"), stdout); diff != "" {
		t.Fatalf("kubectl apply output (-want +got):\n%s\nstderr: %s", diff, stderr)
	}
}

func TestSamplesApplyWithKubectl(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	applySamples(t, ns)

	// The samples are the seed's worked example (docs/architecture.md#the-bounds).
	ctx := context.Background()
	var pool tiergatev1alpha1.ModelPool
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "llm"}, &pool); err != nil {
		t.Fatal(err)
	}
	wantPool := tiergatev1alpha1.ModelPoolSpec{
		DeploymentRef:         tiergatev1alpha1.LocalObjectReference{Name: "llm"},
		ConcurrencyPerReplica: 4,
		ServiceTime: tiergatev1alpha1.ServiceTime{
			Mean:   metav1.Duration{Duration: 6 * time.Second},
			Source: tiergatev1alpha1.ServiceTimeDeclared,
		},
		ClientTimeout: &metav1.Duration{Duration: 30 * time.Second},
		Ageing:        tiergatev1alpha1.Ageing{StarvationBound: &metav1.Duration{Duration: 120 * time.Second}},
		Backend:       tiergatev1alpha1.Backend{Port: 8000, Scheme: "http"},
		Dispatchers: tiergatev1alpha1.Dispatchers{
			Selector:  metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "tiergate-dispatcher"}},
			AdminPort: 9090,
		},
		Authentication: tiergatev1alpha1.Authentication{Mode: tiergatev1alpha1.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
		SharedState:    tiergatev1alpha1.SharedStateLocal,
		DefaultTier:    "free",
		ExemptPaths:    []string{"/health", "/v1/models"},
	}
	if diff := cmp.Diff(wantPool, pool.Spec); diff != "" {
		t.Errorf("ModelPool llm spec (-want +got):\n%s", diff)
	}

	var tiers tiergatev1alpha1.ServiceTierList
	if err := k8sClient.List(ctx, &tiers, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	type tier struct {
		Name, Pool string
		Base       int32
		Wait       time.Duration
		Share      string
	}
	var gotTiers []tier
	for _, st := range tiers.Items {
		gotTiers = append(gotTiers, tier{st.Name, st.Spec.PoolRef.Name, st.Spec.BasePriority, st.Spec.TolerableWait.Duration, st.Spec.TenantShare.String()})
	}
	sort.Slice(gotTiers, func(i, j int) bool { return gotTiers[i].Base < gotTiers[j].Base })
	wantTiers := []tier{
		{"premium", "llm", 0, 5 * time.Second, "250m"},
		{"standard", "llm", 10, 20 * time.Second, "100m"},
		{"free", "llm", 20, 60 * time.Second, "40m"},
	}
	if diff := cmp.Diff(wantTiers, gotTiers); diff != "" {
		t.Errorf("ServiceTiers (-want +got):\n%s", diff)
	}
	// The shares as numbers, not only as canonical strings.
	for _, st := range tiers.Items {
		want := map[string]int64{"premium": 250, "standard": 100, "free": 40}[st.Name]
		if got := st.Spec.TenantShare.MilliValue(); got != want {
			t.Errorf("tier %s: tenantShare = %dm, want %dm", st.Name, got, want)
		}
	}

	var quotas tiergatev1alpha1.TenantQuotaList
	if err := k8sClient.List(ctx, &quotas, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	gotQuotas := map[string]string{}
	for _, q := range quotas.Items {
		if q.Spec.MaxConcurrency != nil || q.Spec.APIKeySecretRef != nil {
			t.Errorf("quota %s sets optional fields the sample does not", q.Name)
		}
		gotQuotas[q.Spec.Tenant] = q.Spec.TierRef.Name
	}
	if diff := cmp.Diff(map[string]string{"acme": "premium", "globex": "standard", "initech": "free"}, gotQuotas); diff != "" {
		t.Errorf("TenantQuotas tenant→tier (-want +got):\n%s", diff)
	}

	// The category "tiergate" names every object of the group.
	stdout, stderr, err := kubectl(t, "get", "tiergate", "-n", ns, "-o", "name")
	if err != nil {
		t.Fatalf("kubectl get tiergate: %v\n%s", err, stderr)
	}
	gotNames := strings.Split(strings.TrimSpace(stdout), "\n")
	sort.Strings(gotNames)
	wantNames := append([]string(nil), sampleObjects[1:]...) // not the Deployment
	sort.Strings(wantNames)
	if diff := cmp.Diff(wantNames, gotNames); diff != "" {
		t.Errorf("kubectl get tiergate -o name (-want +got):\n%s", diff)
	}

	// A second apply changes nothing.
	stdout, stderr, err = kubectl(t, "apply", "-n", ns, "-f", "config/samples")
	if err != nil {
		t.Fatalf("second apply: %v\n%s", err, stderr)
	}
	if diff := cmp.Diff(applyLines("unchanged"), stdout); diff != "" {
		t.Errorf("second apply output (-want +got):\n%s", diff)
	}
}

var agePattern = regexp.MustCompile(`^[0-9]+s$`)

// table splits kubectl's column output into cells, cutting each line where
// the header's columns start (an empty cell is "").
func table(out string) [][]string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	var starts []int
	for i, r := range lines[0] {
		if r != ' ' && (i == 0 || lines[0][i-1] == ' ') {
			starts = append(starts, i)
		}
	}
	rows := make([][]string, 0, len(lines))
	for _, line := range lines {
		row := make([]string, len(starts))
		for c, start := range starts {
			end := len(line)
			if c+1 < len(starts) && starts[c+1] < end {
				end = starts[c+1]
			}
			if start < end {
				row[c] = strings.TrimSpace(line[start:end])
			}
		}
		rows = append(rows, row)
	}
	return rows
}

func TestGetServiceTiersShowsPrinterColumns(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	applySamples(t, ns)

	// Play the controller for one tier, so BOUND and TENANT-LIMIT show
	// values from the status subresource.
	ctx := context.Background()
	var premium tiergatev1alpha1.ServiceTier
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "premium"}, &premium); err != nil {
		t.Fatal(err)
	}
	premium.Status.QueueBound = 20
	premium.Status.TenantConcurrencyLimit = 6
	premium.Status.MaxWait = &metav1.Duration{Duration: 46 * time.Second}
	if err := k8sClient.Status().Update(ctx, &premium); err != nil {
		t.Fatalf("status update: %v", err)
	}

	want := [][]string{
		{"NAME", "POOL", "PRIORITY", "WAIT", "SHARE", "BOUND", "TENANT-LIMIT", "TENANT-TPM", "AGE"},
		{"free", "llm", "20", "60s", "0.04", "", "", ""},
		{"premium", "llm", "0", "5s", "0.25", "20", "6", ""},
		{"standard", "llm", "10", "20s", "0.10", "", "", ""},
	}
	for _, resource := range []string{"servicetiers", "st"} {
		stdout, stderr, err := kubectl(t, "get", resource, "-n", ns)
		if err != nil {
			t.Fatalf("kubectl get %s: %v\n%s", resource, err, stderr)
		}
		got := table(stdout)
		for i := 1; i < len(got); i++ {
			n := len(got[i])
			if !agePattern.MatchString(got[i][n-1]) {
				t.Errorf("kubectl get %s: row %q: AGE is not like 5s", resource, got[i])
			}
			got[i] = got[i][:n-1] // AGE varies
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("kubectl get %s (-want +got):\n%s\nstdout:\n%s", resource, diff, stdout)
		}
	}

	// The status subresource keeps spec and status apart: a spec update
	// through the main resource cannot write status.
	premium.Status.QueueBound = 99
	premium.Spec.TenantShare = resource.MustParse("0.5")
	if err := k8sClient.Update(ctx, &premium); err != nil {
		t.Fatal(err)
	}
	var back tiergatev1alpha1.ServiceTier
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(&premium), &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ptr.To(int32(20)), ptr.To(back.Status.QueueBound)); diff != "" {
		t.Errorf("status.queueBound after a main-resource update (-want +got):\n%s", diff)
	}
	if got := back.Spec.TenantShare.String(); got != "500m" {
		t.Errorf("spec.tenantShare = %s, want 500m", got)
	}
}
