package helm

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

var (
	dispatcherSelector = map[string]any{"app.kubernetes.io/name": "tiergate-dispatcher", "app.kubernetes.io/instance": release}
	controllerSelector = map[string]any{"app.kubernetes.io/name": "tiergate-controller", "app.kubernetes.io/instance": release}
	tokenMount         = map[string]any{"name": "push-token", "mountPath": "/var/run/tiergate/push-token", "readOnly": true}
)

func TestDefaultObjects(t *testing.T) {
	objs := render(t)
	controller := find(t, objs, "Deployment", "tiergate-controller")
	dispatcher := find(t, objs, "Deployment", "tiergate-dispatcher")

	t.Run("every object carries the release labels", func(t *testing.T) {
		for _, o := range objs {
			l := o.GetLabels()
			if l["app.kubernetes.io/instance"] != release || l["app.kubernetes.io/managed-by"] != "Helm" || l["app.kubernetes.io/part-of"] != "tiergate" {
				t.Errorf("%s/%s labels %v lack the release labels", o.GetKind(), o.GetName(), l)
			}
		}
	})

	t.Run("flags", func(t *testing.T) {
		tests := map[string]struct {
			deploy *unstructured.Unstructured
			want   []string
		}{
			"controller": {controller, []string{
				"controller",
				"--leader-elect=true",
				"--leader-election-namespace=" + namespace,
				"--metrics-bind-address=:8080",
				"--health-probe-bind-address=:8081",
				"--push-token-file=/var/run/tiergate/push-token/token",
				"--push-workers=16",
				"--push-token-secret=" + namespace + "/tiergate-push-token",
				"--push-token-secret-key=token",
			}},
			"dispatcher": {dispatcher, []string{
				"dispatcher",
				"--listen=:8080",
				"--admin-listen=:9090",
				"--admin-token-file=/var/run/tiergate/push-token/token",
				"--drain-timeout=30s",
				"--state=local",
				"--backend-dial-timeout=5s",
				"--backend-idle-timeout=90s",
				"--backend-max-idle-conns-per-host=1024",
				"--backend-response-header-timeout=300s",
				"--backend-max-response-header-bytes=1048576",
				"--memory-limit=$(TIERGATE_MEMORY_LIMIT)",
			}},
		}
		for name, tc := range tests {
			t.Run(name, func(t *testing.T) {
				c := container(t, tc.deploy)
				if diff := cmp.Diff(toYAMLValue(t, tc.want), c["args"]); diff != "" {
					t.Errorf("args (-want +got):\n%s", diff)
				}
				if c["command"] != nil {
					t.Errorf("command = %v; the image's entrypoint /tiergate must run", c["command"])
				}
				if got := c["image"]; got != "ghcr.io/tiergate/tiergate:0.1.0" {
					t.Errorf("image = %v, want the appVersion tag", got)
				}
			})
		}
	})

	t.Run("dispatcher ports and probes", func(t *testing.T) {
		c := container(t, dispatcher)
		wantPorts := []map[string]any{
			{"name": "data", "containerPort": 8080, "protocol": "TCP"},
			{"name": "admin", "containerPort": 9090, "protocol": "TCP"},
		}
		if diff := cmp.Diff(toYAMLValue(t, wantPorts), c["ports"]); diff != "" {
			t.Errorf("ports (-want +got):\n%s", diff)
		}
		for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
			get := c[probe].(map[string]any)["httpGet"]
			if diff := cmp.Diff(toYAMLValue(t, map[string]any{"path": path, "port": "admin"}), get); diff != "" {
				t.Errorf("%s (-want +got):\n%s", probe, diff)
			}
		}
		grace := field[float64](t, dispatcher, "spec", "template", "spec", "terminationGracePeriodSeconds")
		preStop := c["lifecycle"].(map[string]any)["preStop"].(map[string]any)["sleep"].(map[string]any)["seconds"].(float64)
		if grace != 60 || preStop != 5 || grace <= preStop+30 {
			t.Errorf("grace %v, preStop sleep %v: want 60 and 5, and grace > preStop + drain (30)", grace, preStop)
		}
	})

	t.Run("controller probes", func(t *testing.T) {
		c := container(t, controller)
		for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
			get := c[probe].(map[string]any)["httpGet"]
			if diff := cmp.Diff(toYAMLValue(t, map[string]any{"path": path, "port": "health"}), get); diff != "" {
				t.Errorf("%s (-want +got):\n%s", probe, diff)
			}
		}
		wantPorts := []map[string]any{
			{"name": "metrics", "containerPort": 8080, "protocol": "TCP"},
			{"name": "health", "containerPort": 8081, "protocol": "TCP"},
		}
		if diff := cmp.Diff(toYAMLValue(t, wantPorts), c["ports"]); diff != "" {
			t.Errorf("ports (-want +got):\n%s", diff)
		}
	})

	t.Run("the Service exposes the data port only", func(t *testing.T) {
		svc := find(t, objs, "Service", "tiergate-dispatcher")
		want := []map[string]any{{"name": "http", "port": 80, "targetPort": "data", "protocol": "TCP"}}
		if diff := cmp.Diff(toYAMLValue(t, want), field[[]any](t, svc, "spec", "ports")); diff != "" {
			t.Errorf("Service ports (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(dispatcherSelector, field[map[string]any](t, svc, "spec", "selector")); diff != "" {
			t.Errorf("Service selector (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(dispatcherSelector, field[map[string]any](t, dispatcher, "spec", "selector", "matchLabels")); diff != "" {
			t.Errorf("dispatcher Deployment selector (-want +got):\n%s", diff)
		}
		for _, o := range objs {
			if o.GetKind() == "Service" && o.GetName() != "tiergate-dispatcher" {
				t.Errorf("unexpected Service %s with default values", o.GetName())
			}
		}
	})

	t.Run("security contexts", func(t *testing.T) {
		wantPod := map[string]any{
			"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
			"seccompProfile": map[string]any{"type": "RuntimeDefault"},
		}
		wantContainer := map[string]any{
			"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "privileged": false,
			"capabilities": map[string]any{"drop": []string{"ALL"}},
		}
		for _, d := range []*unstructured.Unstructured{controller, dispatcher} {
			if diff := cmp.Diff(toYAMLValue(t, wantPod), field[map[string]any](t, d, "spec", "template", "spec", "securityContext")); diff != "" {
				t.Errorf("%s pod securityContext (-want +got):\n%s", d.GetName(), diff)
			}
			if diff := cmp.Diff(toYAMLValue(t, wantContainer), container(t, d)["securityContext"]); diff != "" {
				t.Errorf("%s container securityContext (-want +got):\n%s", d.GetName(), diff)
			}
		}
	})

	t.Run("both roles mount the push token, the controller's optionally", func(t *testing.T) {
		volume := func(optional bool) map[string]any {
			sec := map[string]any{
				"secretName": "tiergate-push-token", "defaultMode": 0o440,
				"items": []any{map[string]any{"key": "token", "path": "token"}},
			}
			if optional {
				sec["optional"] = true
			}
			return map[string]any{"name": "push-token", "secret": sec}
		}
		// The controller creates the Secret, so its own pod must start
		// without it; the dispatchers wait for it.
		for d, optional := range map[*unstructured.Unstructured]bool{controller: true, dispatcher: false} {
			vols := field[[]any](t, d, "spec", "template", "spec", "volumes")
			if diff := cmp.Diff(toYAMLValue(t, []any{volume(optional)}), vols); diff != "" {
				t.Errorf("%s volumes (-want +got):\n%s", d.GetName(), diff)
			}
			if diff := cmp.Diff(toYAMLValue(t, []any{tokenMount}), container(t, d)["volumeMounts"]); diff != "" {
				t.Errorf("%s volumeMounts (-want +got):\n%s", d.GetName(), diff)
			}
		}
		for _, o := range objs {
			if o.GetKind() == "Secret" {
				t.Errorf("the default render holds Secret %s: the controller creates the token Secret", o.GetName())
			}
		}
	})

	t.Run("the controller may create the token Secret and touch only that one", func(t *testing.T) {
		role := find(t, objs, "Role", "tiergate-controller-push-token")
		want := []any{
			map[string]any{"apiGroups": []any{""}, "resources": []any{"secrets"}, "verbs": []any{"create"}},
			map[string]any{"apiGroups": []any{""}, "resources": []any{"secrets"}, "resourceNames": []any{"tiergate-push-token"}, "verbs": []any{"get", "update"}},
		}
		if diff := cmp.Diff(toYAMLValue(t, want), field[[]any](t, role, "rules")); diff != "" {
			t.Errorf("push token Role rules (-want +got):\n%s", diff)
		}
		if ns := role.GetNamespace(); ns != namespace {
			t.Errorf("push token Role in %q, want the release namespace", ns)
		}
		binding := find(t, objs, "RoleBinding", "tiergate-controller-push-token")
		subject := field[[]any](t, binding, "subjects")[0].(map[string]any)
		if subject["name"] != "tiergate-controller" || subject["namespace"] != namespace {
			t.Errorf("push token RoleBinding subject %v", subject)
		}
	})

	t.Run("the dispatcher has no Kubernetes identity", func(t *testing.T) {
		sa := find(t, objs, "ServiceAccount", "tiergate-dispatcher")
		if got := sa.Object["automountServiceAccountToken"]; got != false {
			t.Errorf("dispatcher ServiceAccount automountServiceAccountToken = %v, want false", got)
		}
		pod := field[map[string]any](t, dispatcher, "spec", "template", "spec")
		if pod["automountServiceAccountToken"] != false || pod["serviceAccountName"] != "tiergate-dispatcher" {
			t.Errorf("dispatcher pod: automount %v, account %v; want false, tiergate-dispatcher", pod["automountServiceAccountToken"], pod["serviceAccountName"])
		}
		if got := field[string](t, controller, "spec", "template", "spec", "serviceAccountName"); got != "tiergate-controller" {
			t.Errorf("controller pod account = %s", got)
		}
		for _, o := range objs {
			if o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding" {
				continue
			}
			for _, s := range field[[]any](t, o, "subjects") {
				if s.(map[string]any)["name"] != "tiergate-controller" {
					t.Errorf("%s %s binds %v; only the controller may be bound", o.GetKind(), o.GetName(), s)
				}
			}
		}
	})

	t.Run("NetworkPolicy", func(t *testing.T) {
		np := find(t, objs, "NetworkPolicy", "tiergate-dispatcher")
		if diff := cmp.Diff(dispatcherSelector, field[map[string]any](t, np, "spec", "podSelector", "matchLabels")); diff != "" {
			t.Errorf("podSelector (-want +got):\n%s", diff)
		}
		want := []any{
			map[string]any{
				"from":  []any{map[string]any{"podSelector": map[string]any{"matchLabels": controllerSelector}}},
				"ports": []any{map[string]any{"port": "admin", "protocol": "TCP"}},
			},
			map[string]any{"ports": []any{map[string]any{"port": "data", "protocol": "TCP"}}},
		}
		if diff := cmp.Diff(toYAMLValue(t, want), field[[]any](t, np, "spec", "ingress")); diff != "" {
			t.Errorf("ingress (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(controllerSelector, field[map[string]any](t, controller, "spec", "template", "metadata", "labels"), cmpSubset()); diff != "" {
			t.Errorf("the controller pods do not carry the labels the policy admits (-want +got):\n%s", diff)
		}
	})

	t.Run("PodDisruptionBudget", func(t *testing.T) {
		pdb := find(t, objs, "PodDisruptionBudget", "tiergate-dispatcher")
		want := map[string]any{"maxUnavailable": 1, "selector": map[string]any{"matchLabels": dispatcherSelector}}
		if diff := cmp.Diff(toYAMLValue(t, want), pdb.Object["spec"]); diff != "" {
			t.Errorf("spec (-want +got):\n%s", diff)
		}
	})

	t.Run("controller replicas and leader election", func(t *testing.T) {
		if got := field[float64](t, controller, "spec", "replicas"); got != 1 {
			t.Errorf("controller replicas = %v, want 1", got)
		}
		if got := field[float64](t, dispatcher, "spec", "replicas"); got != 2 {
			t.Errorf("dispatcher replicas = %v, want 2", got)
		}
	})

	t.Run("optional objects are off", func(t *testing.T) {
		for _, o := range objs {
			switch o.GetKind() {
			case "ServiceMonitor", "PrometheusRule", "ConfigMap":
				t.Errorf("%s/%s rendered with default values", o.GetKind(), o.GetName())
			}
		}
	})
}

// cmpSubset compares only the keys of want: the pods carry more labels than
// the selector.
func cmpSubset() cmp.Option {
	return cmp.FilterPath(func(p cmp.Path) bool {
		if mi, ok := p.Last().(cmp.MapIndex); ok {
			vx, _ := mi.Values()
			return !vx.IsValid()
		}
		return false
	}, cmp.Ignore())
}

func TestRedisFlags(t *testing.T) {
	base := []string{"redis.enabled=true", "redis.address=redis.fleet:6379"}
	passwordVol := map[string]any{"name": "redis-password", "secret": map[string]any{"secretName": "redis-auth", "defaultMode": 0o440,
		"items": []any{map[string]any{"key": "pw", "path": "password"}}}}
	passwordMount := map[string]any{"name": "redis-password", "mountPath": "/var/run/tiergate/redis", "readOnly": true}
	caVol := map[string]any{"name": "redis-ca", "secret": map[string]any{"secretName": "redis-ca", "defaultMode": 0o444,
		"items": []any{map[string]any{"key": "ca.pem", "path": "ca.crt"}}}}
	caMount := map[string]any{"name": "redis-ca", "mountPath": "/var/run/tiergate/redis-ca", "readOnly": true}
	tests := map[string]struct {
		set     []string
		setJSON []string
		// wantArgs follow --drain-timeout; wantVolumes and wantMounts follow
		// the push token's.
		wantArgs                []string
		wantVolumes, wantMounts []any
		// What go-redis, which the dispatcher hands the URL to, makes of it.
		wantAddr, wantUser string
		wantDB             int
		wantTLS            bool
		wantCluster        bool
	}{
		"plain": {
			wantArgs: []string{"--state=redis://redis.fleet:6379/0"},
			wantAddr: "redis.fleet:6379",
		},
		"TLS, user and database": {
			set:      []string{"redis.tls.enabled=true", "redis.username=tiergate", "redis.db=4"},
			wantArgs: []string{"--state=rediss://tiergate@redis.fleet:6379/4"},
			wantAddr: "redis.fleet:6379", wantUser: "tiergate", wantDB: 4, wantTLS: true,
		},
		"password from a Secret": {
			set:         []string{"redis.passwordSecret.name=redis-auth", "redis.passwordSecret.key=pw"},
			wantArgs:    []string{"--state=redis://redis.fleet:6379/0", "--redis-password-file=/var/run/tiergate/redis/password"},
			wantVolumes: []any{passwordVol}, wantMounts: []any{passwordMount},
			wantAddr: "redis.fleet:6379",
		},
		"Redis Cluster": {
			set:         []string{"redis.cluster=true"},
			wantArgs:    []string{"--state=redis://redis.fleet:6379/0?cluster=true"},
			wantAddr:    "redis.fleet:6379",
			wantCluster: true,
		},
		"private CA, password and cluster over TLS": {
			set: []string{"redis.cluster=true", "redis.tls.enabled=true", "redis.tls.caSecret.name=redis-ca", "redis.tls.caSecret.key=ca.pem",
				"redis.passwordSecret.name=redis-auth", "redis.passwordSecret.key=pw"},
			wantArgs: []string{"--state=rediss://redis.fleet:6379/0?cluster=true",
				"--redis-password-file=/var/run/tiergate/redis/password", "--redis-ca-file=/var/run/tiergate/redis-ca/ca.crt"},
			wantVolumes: []any{passwordVol, caVol}, wantMounts: []any{passwordMount, caMount},
			wantAddr: "redis.fleet:6379", wantTLS: true, wantCluster: true,
		},
		"lease TTL and renewal interval": {
			set:      []string{"redis.leaseTTLSeconds=30"},
			setJSON:  []string{"redis.renewIntervalSeconds=2.5"},
			wantArgs: []string{"--state=redis://redis.fleet:6379/0", "--state-lease-ttl=30s", "--state-renew-interval=2.5s"},
			wantAddr: "redis.fleet:6379",
		},
		"sub-second lease": {
			setJSON:  []string{"redis.leaseTTLSeconds=0.5", "redis.renewIntervalSeconds=0.25"},
			wantArgs: []string{"--state=redis://redis.fleet:6379/0", "--state-lease-ttl=0.5s", "--state-renew-interval=0.25s"},
			wantAddr: "redis.fleet:6379",
		},
		"renewal interval alone, within the default TTL": {
			set:      []string{"redis.renewIntervalSeconds=5"},
			wantArgs: []string{"--state=redis://redis.fleet:6379/0", "--state-renew-interval=5s"},
			wantAddr: "redis.fleet:6379",
		},
		"settings ignored while disabled": {
			set: []string{"redis.enabled=false", "redis.passwordSecret.name=redis-auth", "redis.tls.enabled=true",
				"redis.cluster=true", "redis.db=3", "redis.tls.caSecret.name=redis-ca", "redis.leaseTTLSeconds=30", "redis.renewIntervalSeconds=20"},
			wantArgs: []string{"--state=local"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			flags := []string{"--set", strings.Join(append(append([]string{}, base...), tc.set...), ",")}
			for _, j := range tc.setJSON {
				flags = append(flags, "--set-json", j)
			}
			d := find(t, render(t, flags...), "Deployment", "tiergate-dispatcher")
			c := container(t, d)
			var args []string
			for _, a := range c["args"].([]any) {
				args = append(args, a.(string))
			}
			want := append([]string{
				"dispatcher", "--listen=:8080", "--admin-listen=:9090",
				"--admin-token-file=/var/run/tiergate/push-token/token", "--drain-timeout=30s",
			}, tc.wantArgs...)
			want = append(want, defaultBackendArgs...)
			want = append(want, "--memory-limit=$(TIERGATE_MEMORY_LIMIT)") // the default 512Mi limit
			if diff := cmp.Diff(want, args); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
			vols := field[[]any](t, d, "spec", "template", "spec", "volumes")
			if len(vols) == 0 {
				t.Fatal("no volumes")
			}
			if diff := cmp.Diff(toYAMLValue(t, append([]any{}, tc.wantVolumes...)), vols[1:]); diff != "" {
				t.Errorf("volumes after the token's (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(toYAMLValue(t, append([]any{tokenMount}, tc.wantMounts...)), c["volumeMounts"]); diff != "" {
				t.Errorf("volumeMounts (-want +got):\n%s", diff)
			}
			if url := strings.TrimPrefix(tc.wantArgs[0], "--state="); url != "local" {
				var got string
				if u, isCluster := strings.CutSuffix(url, "?cluster=true"); isCluster {
					// The dispatcher drops its own parameter before go-redis
					// parses the rest.
					o, err := redis.ParseClusterURL(u)
					if err != nil {
						t.Fatalf("go-redis cannot parse %q as a cluster URL: %v", u, err)
					}
					got = fmt.Sprintf("cluster %v addr %s user %q db 0 tls %v password %q", true, strings.Join(o.Addrs, ","), o.Username, o.TLSConfig != nil, o.Password)
				} else {
					o, err := redis.ParseURL(url)
					if err != nil {
						t.Fatalf("go-redis cannot parse %q: %v", url, err)
					}
					got = fmt.Sprintf("cluster %v addr %s user %q db %d tls %v password %q", false, o.Addr, o.Username, o.DB, o.TLSConfig != nil, o.Password)
				}
				want := fmt.Sprintf("cluster %v addr %s user %q db %d tls %v password %q", tc.wantCluster, tc.wantAddr, tc.wantUser, tc.wantDB, tc.wantTLS, "")
				if got != want {
					t.Errorf("go-redis reads %q as %s, want %s", url, got, want)
				}
			}
			for _, a := range args {
				if strings.Contains(a, "redis-auth") || strings.Contains(a, "=redis-ca") {
					t.Errorf("an argument names a Secret: %q", a)
				}
			}
		})
	}
}

func TestPushTokenModes(t *testing.T) {
	t.Run("existing Secret", func(t *testing.T) {
		objs := render(t, "--set", "pushToken.existingSecret=shared-token,pushToken.key=bearer")
		for _, o := range objs {
			if o.GetKind() == "Secret" {
				t.Errorf("Secret %s rendered although pushToken.existingSecret is set", o.GetName())
			}
		}
		want := map[string]any{"name": "push-token", "secret": map[string]any{
			"secretName": "shared-token", "defaultMode": 0o440,
			"items": []any{map[string]any{"key": "bearer", "path": "token"}},
		}}
		for _, name := range []string{"tiergate-controller", "tiergate-dispatcher"} {
			vols := field[[]any](t, find(t, objs, "Deployment", name), "spec", "template", "spec", "volumes")
			if diff := cmp.Diff(toYAMLValue(t, []any{want}), vols); diff != "" {
				t.Errorf("%s volumes (-want +got):\n%s", name, diff)
			}
		}
		notManaged(t, objs)
	})
	t.Run("fixed value", func(t *testing.T) {
		const token = "a-fixed-token-of-at-least-32-characters!"
		objs := render(t, "--set", "pushToken.value="+token)
		s := find(t, objs, "Secret", "tiergate-push-token")
		raw, err := base64.StdEncoding.DecodeString(field[string](t, s, "data", "token"))
		if err != nil || string(raw) != token {
			t.Errorf("token = %q (err %v), want %q", raw, err, token)
		}
		vol := field[[]any](t, find(t, objs, "Deployment", "tiergate-controller"), "spec", "template", "spec", "volumes")[0].(map[string]any)
		if opt, ok := vol["secret"].(map[string]any)["optional"]; ok {
			t.Errorf("the controller's token volume is optional (%v) although the chart renders the Secret", opt)
		}
		notManaged(t, objs)
	})
}

// notManaged checks that the controller is not asked to create the token
// Secret and has no rights to.
func notManaged(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, a := range args(t, find(t, objs, "Deployment", "tiergate-controller")) {
		if strings.HasPrefix(a, "--push-token-secret") {
			t.Errorf("the controller gets %s although the chart does not leave the Secret to it", a)
		}
	}
	for _, o := range objs {
		if strings.HasSuffix(o.GetName(), "-push-token") && (o.GetKind() == "Role" || o.GetKind() == "RoleBinding") {
			t.Errorf("%s/%s rendered although the controller does not manage the Secret", o.GetKind(), o.GetName())
		}
	}
}

func TestOptionalObjects(t *testing.T) {
	tests := map[string]struct {
		set  string
		want []string
	}{
		"service monitor": {
			set:  "metrics.serviceMonitor.enabled=true",
			want: []string{"Service/tiergate-controller-metrics", "Service/tiergate-dispatcher-metrics", "ServiceMonitor/tiergate"},
		},
		"service monitor without the controller": {
			set:  "metrics.serviceMonitor.enabled=true,controller.enabled=false,pushToken.existingSecret=t,networkPolicy.controllerPeer.podSelector.matchLabels.a=b",
			want: []string{"Service/tiergate-dispatcher-metrics", "ServiceMonitor/tiergate"},
		},
		"prometheus rule":   {set: "metrics.prometheusRule.enabled=true", want: []string{"PrometheusRule/tiergate"}},
		"dashboard":         {set: "metrics.dashboard.enabled=true", want: []string{"ConfigMap/tiergate-dashboard"}},
		"no network policy": {set: "networkPolicy.enabled=false", want: nil},
		"no PDB":            {set: "dispatcher.podDisruptionBudget.enabled=false", want: nil},
	}
	defaults := names(render(t))
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := names(render(t, "--set", tc.set))
			var added, removed []string
			for _, n := range got {
				if !slices.Contains(defaults, n) {
					added = append(added, n)
				}
			}
			for _, n := range defaults {
				if !slices.Contains(got, n) {
					removed = append(removed, n)
				}
			}
			slices.Sort(added)
			if diff := cmp.Diff(tc.want, added); diff != "" {
				t.Errorf("objects added (-want +got):\n%s", diff)
			}
			wantRemoved := map[string][]string{
				"no network policy": {"NetworkPolicy/tiergate-dispatcher"},
				"no PDB":            {"PodDisruptionBudget/tiergate-dispatcher"},
				"service monitor without the controller": {
					"ServiceAccount/tiergate-controller", "ClusterRole/tiergate-controller",
					"ClusterRoleBinding/tiergate-controller", "Role/tiergate-controller-leader-election",
					"RoleBinding/tiergate-controller-leader-election", "Deployment/tiergate-controller",
					"Role/tiergate-controller-push-token", "RoleBinding/tiergate-controller-push-token",
				},
			}[name]
			slices.Sort(removed)
			slices.Sort(wantRemoved)
			if diff := cmp.Diff(wantRemoved, removed); diff != "" {
				t.Errorf("objects removed (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBadValues(t *testing.T) {
	const failAt = "Error: execution error at (tiergate/templates/dispatcher-deployment.yaml:1:4): "
	const schema = "Error: values don't meet the specifications of the schema(s) in the following chart(s):\ntiergate:\n"
	tests := map[string]struct {
		set, setJSON string
		want         string // the whole error, up to helm's --debug hint
	}{
		"grace period not above preStop + drain": {
			set:  "dispatcher.terminationGracePeriodSeconds=35",
			want: failAt + "dispatcher.terminationGracePeriodSeconds (35) must be greater than dispatcher.preStopSleepSeconds + dispatcher.drainTimeoutSeconds (35), or in-flight requests are killed while draining",
		},
		"body budget below the largest body": {
			set:  "dispatcher.maxQueuedBytes=1048576,dispatcher.maxBodyBytes=2097152",
			want: failAt + "dispatcher.maxQueuedBytes (1048576) must be at least dispatcher.maxBodyBytes (2097152), or a body of the largest size would never fit",
		},
		"body budget below the default largest body": {
			set:  "dispatcher.maxQueuedBytes=1048576",
			want: failAt + "dispatcher.maxQueuedBytes (1048576) must be at least dispatcher.maxBodyBytes (4194304), or a body of the largest size would never fit",
		},
		"negative body budget": {
			set:  "dispatcher.maxQueuedBytes=-1",
			want: schema + "- at '/dispatcher/maxQueuedBytes': minimum: got -1, want 0",
		},
		"data and admin port equal": {
			set:  "dispatcher.adminPort=8080",
			want: failAt + "dispatcher.dataPort and dispatcher.adminPort must differ (both are 8080)",
		},
		"controller ports equal": {
			set:  "controller.healthPort=8080",
			want: failAt + "controller.metricsPort and controller.healthPort must differ (both are 8080)",
		},
		"two controllers without leader election": {
			set:  "controller.replicas=2,controller.leaderElect=false",
			want: failAt + "controller.replicas greater than 1 needs controller.leaderElect: two active controllers would push conflicting policies",
		},
		"redis without an address": {
			set:  "redis.enabled=true",
			want: failAt + "redis.address is required when redis.enabled is true",
		},
		"redis cluster with a database": {
			set:  "redis.enabled=true,redis.address=r:6379,redis.cluster=true,redis.db=2",
			want: failAt + "redis.db (2) must be 0 with redis.cluster: Redis Cluster has only database 0",
		},
		"redis CA without TLS": {
			set:  "redis.enabled=true,redis.address=r:6379,redis.tls.caSecret.name=ca",
			want: failAt + "redis.tls.caSecret needs redis.tls.enabled: the dispatcher uses the CA only for rediss://",
		},
		"redis renewal over half the default TTL": {
			set:  "redis.enabled=true,redis.address=r:6379,redis.renewIntervalSeconds=6",
			want: failAt + "redis.renewIntervalSeconds (6) must be at most half the lease TTL (10s)",
		},
		"redis renewal over half the TTL": {
			set:  "redis.enabled=true,redis.address=r:6379,redis.leaseTTLSeconds=4,redis.renewIntervalSeconds=3",
			want: failAt + "redis.renewIntervalSeconds (3) must be at most half the lease TTL (4s)",
		},
		"redis lease under 100ms": {
			set:     "redis.enabled=true,redis.address=r:6379",
			setJSON: "redis.leaseTTLSeconds=0.05",
			want:    failAt + "redis.leaseTTLSeconds (0.05) must be at least 0.1, or 0 for the dispatcher's default",
		},
		"redis lease as a duration string": {
			set:  "redis.enabled=true,redis.address=r:6379,redis.leaseTTLSeconds=10s",
			want: schema + "- at '/redis/leaseTTLSeconds': got string, want number",
		},
		"redis lease over an hour": {
			set:  "redis.leaseTTLSeconds=3601",
			want: schema + "- at '/redis/leaseTTLSeconds': maximum: got 3,601, want 3,600",
		},
		"redis CA key empty": {
			set:  "redis.tls.caSecret.key=",
			want: schema + "- at '/redis/tls/caSecret/key': minLength: got 0, want 1",
		},
		"backend CA from a Secret and a ConfigMap": {
			set:  "dispatcher.backend.tls.caSecret.name=a,dispatcher.backend.tls.caConfigMap.name=b",
			want: failAt + "dispatcher.backend.tls: set caSecret or caConfigMap, not both: the dispatcher takes one CA file",
		},
		"backend dial timeout 0": {
			set:  "dispatcher.backend.dialTimeoutSeconds=0",
			want: schema + "- at '/dispatcher/backend/dialTimeoutSeconds': exclusiveMinimum: got 0, want 0",
		},
		"backend idle connections 0": {
			set:  "dispatcher.backend.maxIdleConnsPerHost=0",
			want: schema + "- at '/dispatcher/backend/maxIdleConnsPerHost': minimum: got 0, want 1",
		},
		"backend timeout as a duration string": {
			set:  "dispatcher.backend.responseHeaderTimeoutSeconds=5m",
			want: schema + "- at '/dispatcher/backend/responseHeaderTimeoutSeconds': got string, want number",
		},
		"backend CA key empty": {
			set:  "dispatcher.backend.tls.caConfigMap.key=",
			want: schema + "- at '/dispatcher/backend/tls/caConfigMap/key': minLength: got 0, want 1",
		},
		"no controller and no controller peer": {
			set:  "controller.enabled=false,pushToken.existingSecret=x",
			want: failAt + "networkPolicy.controllerPeer is required when controller.enabled is false: otherwise no controller could push policies to these dispatchers",
		},
		"no controller and no shared token": {
			set:  "controller.enabled=false,networkPolicy.controllerPeer.podSelector.matchLabels.a=b",
			want: failAt + "pushToken.existingSecret is required when controller.enabled is false: the dispatchers must share the token of the controller that pushes to them",
		},
		"three controllers": {
			set:  "controller.replicas=3",
			want: schema + "- at '/controller/replicas': maximum: got 3, want 2",
		},
		"no controller replica": {
			set:  "controller.replicas=0",
			want: schema + "- at '/controller/replicas': minimum: got 0, want 1",
		},
		"no dispatcher replica": {
			set:  "dispatcher.replicas=0",
			want: schema + "- at '/dispatcher/replicas': minimum: got 0, want 1",
		},
		"unknown key": {
			set:  "dispatcher.unknown=1",
			want: schema + "- at '/dispatcher': additional properties 'unknown' not allowed",
		},
		"digest that is not one": {
			set:  "image.digest=latest",
			want: schema + "- at '/image/digest': 'latest' does not match pattern '^(sha256:[a-f0-9]{64})?$'",
		},
		"short token": {
			set:  "pushToken.value=short",
			want: schema + `- at '/pushToken/value': 'short' does not match pattern '^(|[\\x21-\\x7e]{32,})$'`,
		},
		"redis URL instead of host:port": {
			set:  "redis.address=redis://x:1",
			want: schema + `- at '/redis/address': 'redis://x:1' does not match pattern '^(|[^/@\\s]+:[0-9]{1,5})$'`,
		},
		"ExternalName service": {
			set:  "dispatcher.service.type=ExternalName",
			want: schema + "- at '/dispatcher/service/type': value must be one of 'ClusterIP', 'NodePort', 'LoadBalancer'",
		},
		"interval without a unit": {
			set:  "metrics.serviceMonitor.interval=30",
			want: schema + "- at '/metrics/serviceMonitor/interval': got number, want string",
		},
		"port out of range": {
			set:  "dispatcher.adminPort=70000",
			want: schema + "- at '/dispatcher/adminPort': maximum: got 70,000, want 65,535",
		},
		"extra args not a list": {
			set:  "controller.extraArgs=oops",
			want: schema + "- at '/controller/extraArgs': got string, want array",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			flags := []string{"--set", tc.set}
			if tc.setJSON != "" {
				flags = append(flags, "--set-json", tc.setJSON)
			}
			r := helmCmd.Run(templateArgs(flags...)...)
			if !exitedNonZero(r) {
				t.Fatalf("helm template --set %s succeeded:\n%s", tc.set, r)
			}
			got := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(r.Stderr), "Use --debug flag to render out invalid YAML"))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if r.Stdout != "" {
				t.Errorf("stdout = %q, want nothing", r.Stdout)
			}
		})
	}
}
