package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/internal/testutil"
)

// podProcess is a chart pod's one container run as the real tiergate
// binary, the way a kubelet would run it, with what kwok does not do:
//
//   - the command: the container sets no command, so it is the image's
//     entrypoint, `tiergate`; its args and env are the Pod object's, as
//     the cluster admitted it, never the values file's;
//   - the network namespace: a listen address ":PORT" for one of the
//     container's declared ports becomes "<pod IP>:PORT" (all processes
//     share this machine's loopback, where a pod's wildcard is its IP);
//   - the volumes: each mounted Secret, ConfigMap or projected volume is
//     made from the API objects into a directory laid out as the kubelet
//     lays it out (testutil.SecretVolume), and a mount path at the start
//     of an arg's or env value's path is rewritten to that directory;
//   - env: values, field and resource references resolved from the Pod,
//     and $(VAR) references in args expanded, as the kubelet does; the
//     process gets that env, HOME and HOSTNAME (the pod's name), and
//     nothing of the test's (no KUBECONFIG leaks in);
//   - the in-cluster config: client-go reads the ServiceAccount token and
//     CA from a fixed path this test cannot mount, so a pod that mounts
//     them gets --kubeconfig naming a file that points at the mounted
//     token and ca.crt and the API server, which is what in-cluster
//     config would give it.
//
// Not played: probes (kwok makes the pods Ready by its Stages; the test
// sends them, probeGet), the preStop hook (a sleep before SIGTERM), the
// security context (user 65532, read-only root) and the NetworkPolicy
// (this cluster has no network plugin).
type podProcess struct {
	pod  corev1.Pod
	name string
	// mounts maps a container mount path to its directory here.
	mounts map[string]*mountedVolume
	args   []string
	proc   *testutil.Process
}

// mountedVolume is one volume of the pod, as this test's kubelet made it.
type mountedVolume struct {
	vol corev1.Volume
	dir *testutil.SecretVolume
}

// saMountPath is where the ServiceAccount admission plugin mounts a pod's
// API credentials.
const saMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"

// startPodProcess runs pod's container as described on podProcess. The
// test's Cleanup stops it, if the test did not first.
func startPodProcess(t *testing.T, pod *corev1.Pod) *podProcess {
	t.Helper()
	if len(pod.Spec.Containers) != 1 || pod.Status.PodIP == "" {
		t.Fatalf("pod %s: %d containers, IP %q: want one container and an IP", pod.Name, len(pod.Spec.Containers), pod.Status.PodIP)
	}
	c := &pod.Spec.Containers[0]
	if len(c.Command) != 0 || len(c.EnvFrom) != 0 {
		t.Fatalf("pod %s sets command %q or envFrom: this test runs only the image's entrypoint, tiergate, with env entries", pod.Name, c.Command)
	}
	pp := &podProcess{pod: *pod, name: fmt.Sprintf("%s pod %s (%s)", c.Name, pod.Name, pod.Status.PodIP), mounts: map[string]*mountedVolume{}}
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 || m.SubPath != "" || m.SubPathExpr != "" {
			t.Fatalf("pod %s: mount %+v has no volume or a sub-path", pod.Name, m)
		}
		v := pod.Spec.Volumes[i]
		pp.mounts[m.MountPath] = &mountedVolume{vol: v, dir: testutil.NewSecretVolume(t, volumePayload(t, pod, &v))}
	}
	env := containerEnv(t, pod, c)
	values := map[string]string{}
	cmdEnv := []string{"HOME=" + t.TempDir(), "HOSTNAME=" + pod.Name}
	for _, e := range env {
		values[e.name] = pp.mapPath(e.value)
		cmdEnv = append(cmdEnv, e.name+"="+values[e.name])
	}
	for _, a := range c.Args {
		a = expandVars(a, values)
		pp.args = append(pp.args, bindPodIP(pp.mapPath(a), pod.Status.PodIP, c.Ports))
	}
	if _, ok := pp.mounts[saMountPath]; ok {
		pp.args = append(pp.args, "--kubeconfig="+inClusterKubeconfig(t, pp.dir(saMountPath)))
	}
	cmd := exec.Command(bins.Tiergate, pp.args...)
	cmd.Env = cmdEnv
	pp.proc = testutil.StartT(t, cmd, testutil.Options{Name: pp.name, Grace: 40 * time.Second, LogBytes: 12000})
	return pp
}

// dir is the directory that stands for the container's mount path mp.
func (pp *podProcess) dir(mp string) string { return pp.mounts[mp].dir.Dir() }

// mapPath rewrites a path under one of the container's mount paths, the
// whole string or the value of a --flag=value, to this test's directory.
func (pp *podProcess) mapPath(s string) string {
	prefix, value := "", s
	if strings.HasPrefix(s, "-") {
		if k, v, ok := strings.Cut(s, "="); ok {
			prefix, value = k+"=", v
		}
	}
	for mp, m := range pp.mounts {
		if value == mp || strings.HasPrefix(value, mp+"/") {
			return prefix + m.dir.Dir() + value[len(mp):]
		}
	}
	return s
}

// resync makes the pod's volumes again from the API objects, as the
// kubelet's periodic sync does (an optional Secret that now exists is
// filled in).
func (pp *podProcess) resync(t *testing.T) {
	t.Helper()
	for _, m := range pp.mounts {
		m.dir.Update(volumePayload(t, &pp.pod, &m.vol))
	}
}

// stop sends SIGTERM, as the kubelet does, and wants exit status 0.
func (pp *podProcess) stop(t *testing.T) {
	t.Helper()
	pp.proc.StopClean(t, 40*time.Second)
}

// bindPodIP turns "--flag=:PORT", PORT one of the container's ports, into
// "--flag=<ip>:PORT".
func bindPodIP(arg, ip string, ports []corev1.ContainerPort) string {
	k, v, ok := strings.Cut(arg, "=")
	if !ok || !strings.HasPrefix(v, ":") {
		return arg
	}
	n, err := strconv.Atoi(v[1:])
	if err != nil || !slices.ContainsFunc(ports, func(p corev1.ContainerPort) bool { return int(p.ContainerPort) == n }) {
		return arg
	}
	return k + "=" + net.JoinHostPort(ip, v[1:])
}

// varRef is the kubelet's $(VAR) reference and its $$ escape.
var varRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)`)

// expandVars expands $(VAR) in s with the container's env as the kubelet
// does: $$ is a literal $, and a reference to no variable stays as it is.
func expandVars(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

type envVar struct{ name, value string }

// containerEnv resolves c's env entries in order, as the kubelet does.
// A source this test cannot resolve fails it: it invents no value.
func containerEnv(t *testing.T, pod *corev1.Pod, c *corev1.Container) []envVar {
	t.Helper()
	var out []envVar
	seen := map[string]string{}
	for _, e := range c.Env {
		var v string
		switch src := e.ValueFrom; {
		case src == nil:
			v = expandVars(e.Value, seen)
		case src.FieldRef != nil:
			v = podField(t, pod, src.FieldRef.FieldPath)
		case src.ResourceFieldRef != nil:
			v = resourceField(t, pod, src.ResourceFieldRef)
		case src.SecretKeyRef != nil:
			v = secretData(t, pod.Namespace, src.SecretKeyRef.Name, false)[src.SecretKeyRef.Key]
		case src.ConfigMapKeyRef != nil:
			v = configMapData(t, pod.Namespace, src.ConfigMapKeyRef.Name, false)[src.ConfigMapKeyRef.Key]
		default:
			t.Fatalf("pod %s: env %s has a source this test does not resolve: %+v", pod.Name, e.Name, src)
		}
		seen[e.Name] = v
		out = append(out, envVar{e.Name, v})
	}
	return out
}

// podField is the downward API's value of a field path.
func podField(t *testing.T, pod *corev1.Pod, path string) string {
	t.Helper()
	switch path {
	case "metadata.name":
		return pod.Name
	case "metadata.namespace":
		return pod.Namespace
	case "metadata.uid":
		return string(pod.UID)
	case "spec.nodeName":
		return pod.Spec.NodeName
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName
	case "status.podIP":
		return pod.Status.PodIP
	}
	t.Fatalf("pod %s: field %q is not resolved by this test", pod.Name, path)
	return ""
}

// resourceField is a container's request or limit in units of the
// divisor, rounded up, as the kubelet gives it. A limit the container
// does not set (the kubelet would give the Node's allocatable) fails.
func resourceField(t *testing.T, pod *corev1.Pod, ref *corev1.ResourceFieldSelector) string {
	t.Helper()
	i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == ref.ContainerName })
	if i < 0 {
		t.Fatalf("pod %s: resource field of container %q, which it does not have", pod.Name, ref.ContainerName)
	}
	res := pod.Spec.Containers[i].Resources
	kind, name, _ := strings.Cut(ref.Resource, ".")
	list := map[string]corev1.ResourceList{"limits": res.Limits, "requests": res.Requests}[kind]
	q, ok := list[corev1.ResourceName(name)]
	if !ok {
		t.Fatalf("pod %s: resource field %q is not set on the container", pod.Name, ref.Resource)
	}
	div := ref.Divisor
	if div.IsZero() {
		div = resource.MustParse("1")
	}
	m, d := q.MilliValue(), div.MilliValue()
	return strconv.FormatInt((m+d-1)/d, 10)
}

// volumePayload is what the kubelet puts in a volume: file name ->
// content. An optional Secret or ConfigMap that does not exist gives an
// empty volume; a missing one that is not optional fails the test (the
// kubelet would not start the container; callers wait for it first).
func volumePayload(t *testing.T, pod *corev1.Pod, v *corev1.Volume) map[string]string {
	t.Helper()
	out := map[string]string{}
	switch {
	case v.Secret != nil:
		data := secretData(t, pod.Namespace, v.Secret.SecretName, v.Secret.Optional != nil && *v.Secret.Optional)
		addItems(t, out, data, v.Secret.Items)
	case v.ConfigMap != nil:
		data := configMapData(t, pod.Namespace, v.ConfigMap.Name, v.ConfigMap.Optional != nil && *v.ConfigMap.Optional)
		addItems(t, out, data, v.ConfigMap.Items)
	case v.Projected != nil:
		for _, src := range v.Projected.Sources {
			projectSource(t, pod, src, out)
		}
	default:
		t.Fatalf("pod %s: volume %s is of a kind this test does not make: %+v", pod.Name, v.Name, v.VolumeSource)
	}
	return out
}

// projectSource adds one source of a projected volume to out.
func projectSource(t *testing.T, pod *corev1.Pod, src corev1.VolumeProjection, out map[string]string) {
	t.Helper()
	switch {
	case src.ServiceAccountToken != nil:
		out[src.ServiceAccountToken.Path] = serviceAccountToken(t, pod, src.ServiceAccountToken)
	case src.ConfigMap != nil:
		optional := src.ConfigMap.Optional != nil && *src.ConfigMap.Optional
		addItems(t, out, configMapData(t, pod.Namespace, src.ConfigMap.Name, optional), src.ConfigMap.Items)
	case src.Secret != nil:
		optional := src.Secret.Optional != nil && *src.Secret.Optional
		addItems(t, out, secretData(t, pod.Namespace, src.Secret.Name, optional), src.Secret.Items)
	case src.DownwardAPI != nil:
		for _, it := range src.DownwardAPI.Items {
			if it.FieldRef == nil {
				t.Fatalf("pod %s: downward API item %+v is not a field", pod.Name, it)
			}
			out[it.Path] = podField(t, pod, it.FieldRef.FieldPath)
		}
	default:
		t.Fatalf("pod %s: projected source %+v is not made by this test", pod.Name, src)
	}
}

// addItems adds data to out, all keys or the listed items (key -> path).
func addItems(t *testing.T, out, data map[string]string, items []corev1.KeyToPath) {
	t.Helper()
	if items == nil {
		for k, v := range data {
			out[k] = v
		}
		return
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok && len(data) > 0 {
			t.Fatalf("volume item %q: no such key", it.Key)
		}
		if ok {
			out[it.Path] = v
		}
	}
}

// serviceAccountToken asks the TokenRequest API for a token of the pod's
// ServiceAccount bound to the pod, as the kubelet does for a projected
// serviceAccountToken source.
func serviceAccountToken(t *testing.T, pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection) string {
	t.Helper()
	cs, err := kc.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	var aud []string
	if src.Audience != "" {
		aud = []string{src.Audience}
	}
	tr, err := cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(context.Background(), pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences:         aud,
			ExpirationSeconds: src.ExpirationSeconds,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for ServiceAccount %s/%s: %v", pod.Namespace, pod.Spec.ServiceAccountName, err)
	}
	return tr.Status.Token
}

func secretData(t *testing.T, ns, name string, optional bool) map[string]string {
	t.Helper()
	var s corev1.Secret
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		if apierrors.IsNotFound(err) && optional {
			return nil
		}
		t.Fatalf("Secret %s/%s of a pod's volume or env: %v", ns, name, err)
	}
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	return out
}

func configMapData(t *testing.T, ns, name string, optional bool) map[string]string {
	t.Helper()
	var cm corev1.ConfigMap
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &cm); err != nil {
		if apierrors.IsNotFound(err) && optional {
			return nil
		}
		t.Fatalf("ConfigMap %s/%s of a pod's volume or env: %v", ns, name, err)
	}
	return cm.Data
}

// inClusterKubeconfig writes the kubeconfig in-cluster config amounts to:
// the API server, the mounted ca.crt and token file (read again as the
// kubelet renews it) and the mounted namespace.
func inClusterKubeconfig(t *testing.T, saDir string) string {
	t.Helper()
	admin, err := clientcmd.LoadFromFile(kc.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cur := admin.Contexts[admin.CurrentContext]
	if cur == nil || admin.Clusters[cur.Cluster] == nil {
		t.Fatalf("admin kubeconfig %s has no current cluster", kc.Kubeconfig)
	}
	ns, err := os.ReadFile(filepath.Join(saDir, "namespace"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["in-cluster"] = &clientcmdapi.Cluster{Server: admin.Clusters[cur.Cluster].Server, CertificateAuthority: filepath.Join(saDir, "ca.crt")}
	cfg.AuthInfos["pod"] = &clientcmdapi.AuthInfo{TokenFile: filepath.Join(saDir, "token")}
	cfg.Contexts["in-cluster"] = &clientcmdapi.Context{Cluster: "in-cluster", AuthInfo: "pod", Namespace: string(ns)}
	cfg.CurrentContext = "in-cluster"
	path := filepath.Join(t.TempDir(), "in-cluster.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// probeGet sends a container's HTTP probe as the kubelet would: to the
// pod IP (or the probe's host) and the named or numbered port, with the
// probe's headers and timeout. It returns the status code.
func probeGet(pod *corev1.Pod, p *corev1.Probe) (int, error) {
	if p == nil || p.HTTPGet == nil {
		return 0, fmt.Errorf("pod %s: probe %+v is not an HTTP GET", pod.Name, p)
	}
	g := p.HTTPGet
	port := g.Port.IntValue()
	if g.Port.StrVal != "" {
		for _, cp := range pod.Spec.Containers[0].Ports {
			if cp.Name == g.Port.StrVal {
				port = int(cp.ContainerPort)
			}
		}
	}
	host, scheme := g.Host, strings.ToLower(string(g.Scheme))
	if host == "" {
		host = pod.Status.PodIP
	}
	if scheme == "" {
		scheme = "http"
	}
	req, err := http.NewRequest(http.MethodGet, scheme+"://"+net.JoinHostPort(host, strconv.Itoa(port))+g.Path, nil)
	if err != nil {
		return 0, err
	}
	for _, h := range g.HTTPHeaders {
		req.Header.Set(h.Name, h.Value)
	}
	timeout := time.Duration(max(p.TimeoutSeconds, 1)) * time.Second
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestPodProcessRewrites pins how a container's args become the
// process's: $(VAR) expansion as the kubelet does it, mount paths mapped
// only at a path boundary, and wildcard listens of declared ports bound
// to the pod IP. It needs no cluster.
func TestPodProcessRewrites(t *testing.T) {
	pp := &podProcess{mounts: map[string]*mountedVolume{
		"/var/run/tiergate/push-token": {dir: testutil.NewSecretVolume(t, map[string]string{"token": "x"})},
	}}
	dir := pp.dir("/var/run/tiergate/push-token")
	ports := []corev1.ContainerPort{{Name: "data", ContainerPort: 8080}}
	env := map[string]string{"LIMIT": "536870912", "EMPTY": ""}
	for _, tc := range []struct{ arg, want string }{
		{"--memory-limit=$(LIMIT)", "--memory-limit=536870912"},
		{"--x=$(EMPTY)y", "--x=y"},
		{"--x=$(UNSET)", "--x=$(UNSET)"},
		{"--x=$$(LIMIT)", "--x=$(LIMIT)"},
		{"--x=$$$(LIMIT)", "--x=$536870912"},
		{"--admin-token-file=/var/run/tiergate/push-token/token", "--admin-token-file=" + dir + "/token"},
		{"/var/run/tiergate/push-token", dir},
		{"--x=/var/run/tiergate/push-token-other/token", "--x=/var/run/tiergate/push-token-other/token"},
		{"--x=/etc/var/run/tiergate/push-token/token", "--x=/etc/var/run/tiergate/push-token/token"},
		{"--listen=:8080", "--listen=127.88.0.7:8080"},
		{"--listen=:9999", "--listen=:9999"},
		{"--listen=0.0.0.0:8080", "--listen=0.0.0.0:8080"},
		{"dispatcher", "dispatcher"},
	} {
		got := bindPodIP(pp.mapPath(expandVars(tc.arg, env)), "127.88.0.7", ports)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%q (-want +got):\n%s", tc.arg, diff)
		}
	}
}
