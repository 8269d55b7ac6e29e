package controller

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// secretsAuditPolicy makes the API server log every request for Secrets
// with its answer, and nothing else.
const secretsAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: RequestResponse
    resources:
      - group: ""
        resources: ["secrets"]
  - level: None
`

// auditEvent is the part of an audit.k8s.io/v1 Event the tests read.
type auditEvent struct {
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef struct {
		Resource, Namespace, Name string
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	ResponseObject json.RawMessage `json:"responseObject"`
}

// controllerSecretRequests are the audited requests of the controller for
// Secrets.
func controllerSecretRequests(t *testing.T) []auditEvent {
	t.Helper()
	f, err := os.Open(auditLog)
	if err != nil {
		t.Fatalf("the API server's audit log: %v", err)
	}
	defer f.Close()
	user := "system:serviceaccount:" + controllerNamespace + ":tiergate-controller"
	var out []auditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var ev auditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("audit line %q: %v", testutil.LastBytes(sc.Text(), 200), err)
		}
		if ev.User.Username == user && ev.ObjectRef.Resource == "secrets" {
			out = append(out, ev)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// receivedSecrets are the objects an answer carried: a Secret, a list's
// items, or the metadata alone.
type receivedObject struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Data  map[string]string `json:"data"`
	Items []receivedObject  `json:"items"`
}

// checkSecretRequests holds every Secret request of the controller to the
// rule: a list or watch selects tiergate.dev/api-keys=true, a list's items
// all carry the label, and a get answers only metadata (or 404). It
// returns how many metadata gets named name.
func checkSecretRequests(t *testing.T, events []auditEvent, name string) (lists, watches, metaGets int) {
	t.Helper()
	for _, ev := range events {
		u, err := url.Parse(ev.RequestURI)
		if err != nil {
			t.Fatal(err)
		}
		var got receivedObject
		if len(ev.ResponseObject) > 0 {
			if err := json.Unmarshal(ev.ResponseObject, &got); err != nil {
				t.Fatalf("answer of %s %s: %v", ev.Verb, ev.RequestURI, err)
			}
		}
		switch ev.Verb {
		case "list", "watch":
			if sel := u.Query().Get("labelSelector"); sel != v1alpha1.APIKeysLabel+"=true" {
				t.Errorf("the controller sent %s %s: selector %q, want %s=true", ev.Verb, ev.RequestURI, sel, v1alpha1.APIKeysLabel)
			}
			for _, it := range got.Items {
				if it.Metadata.Labels[v1alpha1.APIKeysLabel] != "true" {
					t.Errorf("a list answered the controller Secret %s without the label", it.Metadata.Name)
				}
			}
			if ev.Verb == "list" && ev.Stage == "ResponseComplete" {
				lists++
			} else if ev.Verb == "watch" && ev.Stage == "ResponseStarted" {
				watches++
			}
		case "get":
			if ev.ResponseStatus.Code == 200 && got.Kind != "PartialObjectMetadata" {
				t.Errorf("the controller got a whole %s %s/%s (data keys %d)", got.Kind, ev.ObjectRef.Namespace, ev.ObjectRef.Name, len(got.Data))
			}
			if ev.ObjectRef.Name == name && ev.Stage == "ResponseComplete" {
				metaGets++
			}
		default:
			t.Errorf("the controller sent %s %s", ev.Verb, ev.RequestURI)
		}
	}
	return lists, watches, metaGets
}

// A TenantQuota that names a Secret without the tiergate.dev/api-keys
// label gets SecretNotLabelled and none of the Secret's keys reaches a
// dispatcher; once labelled, its keys arrive, and they leave with the
// label. The API server's audit log shows the controller only ever listed
// and watched Secrets with the label, and read no unlabelled one's data.
func TestOnlyLabelledSecretsAreRead(t *testing.T) {
	e, _ := sampleEnv(t, 1)
	ctx := context.Background()
	const password = "hunter2-db-password"
	sum := sha256.Sum256([]byte(password))
	hash := hex.EncodeToString(sum[:])
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "db-creds"}, Data: map[string][]byte{"password": []byte(password)}}
	if err := k8s.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	kubectl.Must(t, "patch", "-n", e.ns, "tenantquota", "acme", "--type=merge", "-p", `{"spec":{"apiKeySecretRef":{"name":"db-creds"}}}`)
	notLabelled := `Secret "db-creds" lacks the label tiergate.dev/api-keys: "true", so the controller does not read it and tenant "acme" is in the policy with no API keys; ` +
		"label it with: kubectl label secret db-creds -n " + e.ns + " tiergate.dev/api-keys=true"
	wantUnlabelled := func(what string) {
		t.Helper()
		quotaEventually(t, e.ns, "acme", what, func(q v1alpha1.TenantQuota) error {
			if err := conditionIs(q.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionFalse, "SecretNotLabelled"); err != nil {
				return err
			}
			if c := condition(q.Status.Conditions, v1alpha1.ConditionReady); c.Message != notLabelled || q.Status.APIKeys != 0 {
				return fmt.Errorf("message %q, apiKeys %d", c.Message, q.Status.APIKeys)
			}
			return nil
		})
		// The quota's status follows the push of the same reconcile: the
		// policy of the pool's current version has no hash for acme.
		if _, err := allHold(e.disp, 5*time.Second, acmeHashes(e, nil)); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	wantUnlabelled("acme SecretNotLabelled")

	kubectl.Must(t, "label", "secret", "db-creds", "-n", e.ns, v1alpha1.APIKeysLabel+"=true")
	if took, err := allHold(e.disp, 5*time.Second, acmeHashes(e, []string{hash})); err != nil {
		t.Fatalf("the labelled Secret's key not pushed after %s: %v", took, err)
	}
	quotaEventually(t, e.ns, "acme", "acme Active once labelled", func(q v1alpha1.TenantQuota) error {
		if q.Status.APIKeys != 1 {
			return fmt.Errorf("apiKeys %d, want 1", q.Status.APIKeys)
		}
		return conditionIs(q.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionTrue, "Active")
	})

	kubectl.Must(t, "label", "secret", "db-creds", "-n", e.ns, v1alpha1.APIKeysLabel+"-")
	wantUnlabelled("acme SecretNotLabelled once the label is removed")

	// The README's upgrade loop labels every Secret a TenantQuota names.
	sh := testutil.Tool{Bin: "bash", Env: []string{"PATH=" + filepath.Dir(kubectl.Bin) + ":" + os.Getenv("PATH"), "KUBECONFIG=" + kubeconfigOf(kubectl)}}
	// A quota of another test may name a Secret that does not exist; the
	// loop goes on past it, and its exit status is that of the last label.
	r := sh.Run("-c", readmeLabelLoop(t))
	if !strings.Contains(r.Stdout, "secret/db-creds labeled") {
		t.Fatalf("the README's label loop did not label db-creds:\n%s", r)
	}
	if took, err := allHold(e.disp, 5*time.Second, acmeHashes(e, []string{hash})); err != nil {
		t.Fatalf("the Secret labelled by the README's loop: key not pushed after %s: %v", took, err)
	}
	kubectl.Must(t, "label", "secret", "db-creds", "-n", e.ns, v1alpha1.APIKeysLabel+"-")
	wantUnlabelled("acme SecretNotLabelled once the label is removed again")

	var lists, watches, gets int
	testutil.Eventually(t, 10*time.Second, "the audit log shows the controller's Secret requests", func() error {
		lists, watches, gets = checkSecretRequests(t, controllerSecretRequests(t), "db-creds")
		// client-go's informers may list then watch, or watch with
		// sendInitialEvents (WatchList) and never list.
		if lists+watches == 0 || gets < 2 {
			return fmt.Errorf("%d lists, %d watches, %d metadata gets of db-creds; want a list or watch and 2 gets", lists, watches, gets)
		}
		return nil
	})
	t.Logf("the controller's Secret requests: %d lists and %d watches, all selecting %s=true; %d metadata-only gets of db-creds",
		lists, watches, v1alpha1.APIKeysLabel, gets)
}

// readmeLabelLoop is the README's shell loop that labels every Secret a
// TenantQuota names.
func readmeLabelLoop(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const start = "# every Secret a TenantQuota names, in every namespace:\n"
	i := strings.Index(string(b), start)
	if i < 0 {
		t.Fatalf("README.md has no %q", start)
	}
	loop, _, ok := strings.Cut(string(b)[i+len(start):], "```")
	if !ok || !strings.Contains(loop, "kubectl label secret") {
		t.Fatalf("README.md's label loop is not a code block: %q", loop)
	}
	return loop
}

// kubeconfigOf is the --kubeconfig a kubectl Tool runs with.
func kubeconfigOf(k testutil.Tool) string {
	for _, a := range k.Args {
		if v, ok := strings.CutPrefix(a, "--kubeconfig="); ok {
			return v
		}
	}
	return ""
}

// acmeHashes accepts a policy of the pool's current version whose tenant
// acme has exactly the hashes want.
func acmeHashes(e *env, want []string) func(*policy.Policy) error {
	return func(p *policy.Policy) error {
		if v := e.pool().Status.PolicyVersion; p.Version != v {
			return fmt.Errorf("holds version %d, the pool is at %d", p.Version, v)
		}
		for _, tn := range p.Tenants {
			if tn.ID == "acme" {
				if strings.Join(tn.APIKeySHA256, ",") != strings.Join(want, ",") {
					return fmt.Errorf("acme's hashes %v, want %v", tn.APIKeySHA256, want)
				}
				return nil
			}
		}
		return fmt.Errorf("no tenant acme in %+v", p.Tenants)
	}
}
