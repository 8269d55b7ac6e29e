package simulate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// Sentinel errors of the input stage, matched with errors.Is.
var (
	ErrUnknownKind  = errors.New("unknown kind")
	ErrUnknownField = errors.New("unknown field")
	ErrMissingLoad  = errors.New("no Load document")
	ErrMissingPool  = errors.New("no ModelPool document")
	ErrDuplicate    = errors.New("duplicate document")
	ErrInvalid      = errors.New("invalid")
	ErrSyntax       = errors.New("malformed document")
)

// Source is one input file.
type Source struct {
	Name string
	Data []byte
}

// Input is everything a run needs: the objects the controller would see
// (already defaulted the way the API server defaults them) and the Load.
type Input struct {
	Pool   *v1alpha1.ModelPool
	Tiers  []v1alpha1.ServiceTier
	Quotas []v1alpha1.TenantQuota
	Load   *Load
	// Warnings are things that are legal but probably not meant, such as a
	// tier of another pool that is ignored.
	Warnings []string
}

// ReadFiles reads and decodes the named files.
func ReadFiles(paths ...string) (*Input, error) {
	srcs := make([]Source, 0, len(paths))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		srcs = append(srcs, Source{Name: p, Data: b})
	}
	return Read(srcs...)
}

// decoder is the scheme's strict deserializer: the same Go types and the
// same unknown-field refusal the API server applies to these kinds.
var decoder = func() runtime.Decoder {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer()
}()

// Read decodes every document of every source. Documents are separated by
// "---"; empty ones are skipped.
func Read(srcs ...Source) (*Input, error) {
	rd := &reader{in: &Input{}}
	for _, src := range srcs {
		if err := rd.source(src); err != nil {
			return nil, err
		}
	}
	return rd.finish()
}

// reader collects the documents of all sources into one Input.
type reader struct {
	in    *Input
	pools []*v1alpha1.ModelPool
	// loadAt names the document the Load came from.
	loadAt string
}

// typeHeader is what every document states about itself.
type typeHeader struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

// source reads the documents of one file. n counts the non-empty ones,
// which is how errors name a document.
func (rd *reader) source(src Source) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(src.Data)))
	n := 1
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w: %v", src.Name, ErrSyntax, err)
		}
		where := fmt.Sprintf("%s: document %d", src.Name, n)
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return fmt.Errorf("%s: %w: %v", where, ErrSyntax, err)
		}
		js = bytes.TrimSpace(js)
		if string(js) == "null" || string(js) == "{}" {
			continue // a comment-only or empty document is not counted
		}
		n++
		if err := rd.document(where, js); err != nil {
			return err
		}
	}
}

// document checks a document's kind and apiVersion and adds it.
func (rd *reader) document(where string, js []byte) error {
	var tm typeHeader
	if err := json.Unmarshal(js, &tm); err != nil {
		return fmt.Errorf("%s: %w: %v", where, ErrSyntax, err)
	}
	switch tm.Kind {
	case "ModelPool", "ServiceTier", "TenantQuota", KindLoad:
	default:
		return fmt.Errorf("%s: %w %q (want ModelPool, ServiceTier, TenantQuota or Load)", where, ErrUnknownKind, tm.Kind)
	}
	if tm.APIVersion != v1alpha1.GroupVersion.String() {
		return fmt.Errorf("%s (%s): %w: apiVersion %q (want %q)", where, tm.Kind, ErrInvalid, tm.APIVersion, v1alpha1.GroupVersion.String())
	}
	if tm.Kind == KindLoad {
		return rd.load(where+" (Load)", js)
	}
	return rd.object(fmt.Sprintf("%s (%s %q)", where, tm.Kind, tm.Metadata.Name), js, tm.Metadata.Name)
}

// load decodes the Load strictly and validates it on its own.
func (rd *reader) load(where string, js []byte) error {
	if rd.loadAt != "" {
		return fmt.Errorf("%s: %w: a second Load (the first is %s)", where, ErrDuplicate, rd.loadAt)
	}
	l := &Load{}
	strict, err := kjson.UnmarshalStrict(js, l)
	if err != nil {
		return fmt.Errorf("%s: %w: %v", where, ErrSyntax, err)
	}
	if err := firstStrict(strict); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if err := l.Spec.validate(); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	rd.in.Load, rd.loadAt = l, where
	return nil
}

// object decodes a ModelPool, ServiceTier or TenantQuota with the scheme's
// strict decoder, then defaults and validates it as the API server would.
func (rd *reader) object(where string, js []byte, name string) error {
	obj, _, err := decoder.Decode(js, nil, nil)
	if err != nil {
		if runtime.IsStrictDecodingError(err) {
			var sde interface{ Errors() []error }
			if errors.As(err, &sde) {
				return fmt.Errorf("%s: %w", where, firstStrict(sde.Errors()))
			}
		}
		return fmt.Errorf("%s: %w: %v", where, ErrSyntax, err)
	}
	if name == "" {
		return fmt.Errorf("%s: %w: metadata.name is required", where, ErrInvalid)
	}
	var raw map[string]any
	_ = json.Unmarshal(js, &raw)
	switch o := obj.(type) {
	case *v1alpha1.ModelPool:
		err = defaultPool(o, raw)
		rd.pools = append(rd.pools, o)
	case *v1alpha1.ServiceTier:
		defaultNamespace(&o.ObjectMeta)
		err = validateTier(o, raw)
		rd.in.Tiers = append(rd.in.Tiers, *o)
	case *v1alpha1.TenantQuota:
		defaultNamespace(&o.ObjectMeta)
		err = validateQuota(o, raw)
		rd.in.Quotas = append(rd.in.Quotas, *o)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// finish checks that there is one pool and one Load and keeps the pool's
// own objects.
func (rd *reader) finish() (*Input, error) {
	in := rd.in
	switch {
	case len(rd.pools) == 0:
		return nil, fmt.Errorf("%w: pass the pool with -f (kind: ModelPool)", ErrMissingPool)
	case len(rd.pools) > 1:
		return nil, fmt.Errorf("%w: %d ModelPools; simulate one pool at a time", ErrDuplicate, len(rd.pools))
	case in.Load == nil:
		return nil, fmt.Errorf("%w: pass one with -f (kind: Load)", ErrMissingLoad)
	}
	in.Pool = rd.pools[0]
	if err := in.resolve(); err != nil {
		return in, err
	}
	in.Warnings = append(in.Warnings, tokenWarnings(&in.Pool.Spec)...)
	return in, in.checkLoadTokens()
}

// firstStrict turns a strict-decoding error list into one error. The
// messages come from sigs.k8s.io/json, as the API server's do: `unknown
// field "spec.foo"`.
func firstStrict(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	m := strings.Join(msgs, ", ")
	if strings.HasPrefix(m, "unknown field ") {
		return fmt.Errorf("%w %s", ErrUnknownField, strings.TrimPrefix(m, "unknown field "))
	}
	return fmt.Errorf("%w: %s", ErrInvalid, m)
}

func defaultNamespace(m *metav1.ObjectMeta) {
	if m.Namespace == "" {
		m.Namespace = "default"
	}
}

// defaultPool applies the CRD's schema defaults (the API server would) and
// the validation rules the simulation depends on, with the CRD's messages.
// raw tells an absent field from an empty one, as structural defaulting
// does.
func defaultPool(p *v1alpha1.ModelPool, raw map[string]any) error {
	defaultNamespace(&p.ObjectMeta)
	spec, _ := raw["spec"].(map[string]any)
	s := &p.Spec
	if _, set := spec["ageing"]; !set {
		s.Ageing.Rate = &metav1.Duration{Duration: capacity.DefaultAgeingRate}
	}
	// Before the defaults, which would fill a field given as 0.
	tokenErrs := checkPoolTokens(s, spec)
	capacity.ApplyDefaults(s)

	var errs []string
	if s.ConcurrencyPerReplica < 1 {
		errs = append(errs, fmt.Sprintf("spec.concurrencyPerReplica: must be at least 1, got %d", s.ConcurrencyPerReplica))
	}
	if s.ServiceTime.Mean.Duration <= 0 {
		errs = append(errs, "spec.serviceTime.mean: serviceTime.mean must be greater than 0")
	}
	if s.ClientTimeout != nil && s.ClientTimeout.Duration < time.Second {
		errs = append(errs, "spec: clientTimeout must be at least 1s")
	}
	a := s.Ageing
	if (a.Rate == nil) == (a.StarvationBound == nil) {
		errs = append(errs, "spec.ageing: ageing must set exactly one of rate and starvationBound")
	}
	if a.Rate != nil && a.Rate.Duration <= 0 {
		errs = append(errs, "spec.ageing.rate: ageing.rate must be greater than 0")
	}
	if a.StarvationBound != nil && a.StarvationBound.Duration <= 0 {
		errs = append(errs, "spec.ageing.starvationBound: ageing.starvationBound must be greater than 0")
	}
	switch s.Authentication.Mode {
	case v1alpha1.AuthTrustedHeader, v1alpha1.AuthAPIKey:
	default:
		errs = append(errs, fmt.Sprintf("spec.authentication.mode: Unsupported value: %q: supported values: \"TrustedHeader\", \"APIKey\"", s.Authentication.Mode))
	}
	switch s.SharedState {
	case v1alpha1.SharedStateLocal, v1alpha1.SharedStateRedis:
	default:
		errs = append(errs, fmt.Sprintf("spec.sharedState: Unsupported value: %q: supported values: \"Local\", \"Redis\"", s.SharedState))
	}
	errs = append(errs, tokenErrs...)
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(errs, "; "))
	}
	return nil
}

func validateTier(t *v1alpha1.ServiceTier, raw map[string]any) error {
	var errs []string
	s := &t.Spec
	if s.PoolRef.Name == "" {
		errs = append(errs, "spec.poolRef.name: Required value")
	}
	if s.BasePriority < 0 || s.BasePriority > 1000000 {
		errs = append(errs, fmt.Sprintf("spec.basePriority: must be in [0, 1000000], got %d", s.BasePriority))
	}
	if s.TolerableWait.Duration <= 0 {
		errs = append(errs, "spec.tolerableWait: tolerableWait must be greater than 0")
	}
	if s.TenantShare.Sign() <= 0 || s.TenantShare.Cmp(oneQuantity) > 0 {
		errs = append(errs, "spec.tenantShare: tenantShare must be greater than 0 and at most 1")
	}
	errs = append(errs, validateBudgets(raw, "tenantLimits", s.TenantLimits)...)
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(errs, "; "))
	}
	return nil
}

func validateQuota(q *v1alpha1.TenantQuota, raw map[string]any) error {
	var errs []string
	if q.Spec.Tenant == "" {
		errs = append(errs, "spec.tenant: Required value")
	}
	if q.Spec.TierRef.Name == "" {
		errs = append(errs, "spec.tierRef.name: Required value")
	}
	if q.Spec.MaxConcurrency != nil && *q.Spec.MaxConcurrency < 1 {
		errs = append(errs, fmt.Sprintf("spec.maxConcurrency: must be at least 1, got %d", *q.Spec.MaxConcurrency))
	}
	spec, _ := raw["spec"].(map[string]any)
	errs = append(errs, inRange("spec.weight", spec, "weight", q.Spec.Weight, v1alpha1.MaxTokenWeight)...)
	errs = append(errs, validateBudgets(raw, "limits", q.Spec.Limits)...)
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(errs, "; "))
	}
	return nil
}

// validateBudgets checks a TenantQuota's spec.limits or a ServiceTier's
// spec.tenantLimits (spec.<name>) as the schema does. raw tells a budget
// given as 0 from one left out, which both decode as 0; the message for
// neither is the CRD rule's.
func validateBudgets(raw map[string]any, name string, l *v1alpha1.Limits) []string {
	if l == nil {
		return nil
	}
	spec, _ := raw["spec"].(map[string]any)
	given, _ := spec[name].(map[string]any)
	field := "spec." + name
	var errs []string
	for _, b := range []struct {
		name string
		v    int64
	}{{"requestsPerMinute", l.RequestsPerMinute}, {"tokensPerMinute", l.TokensPerMinute}} {
		_, set := given[b.name]
		if (set && b.v < 1) || b.v < 0 || b.v > v1alpha1.MaxBudgetPerMinute {
			errs = append(errs, fmt.Sprintf("%s.%s: must be from 1 to %d, got %d", field, b.name, int64(v1alpha1.MaxBudgetPerMinute), b.v))
		}
	}
	if len(given) == 0 {
		errs = append(errs, field+": must set requestsPerMinute, tokensPerMinute or both (leave the field out for no budget)")
	}
	return errs
}

var oneQuantity = resource.MustParse("1")

// resolve keeps the tiers and quotas of the pool, as the controller's
// watches would, and says what it left out.
func (in *Input) resolve() error {
	p := in.Pool
	var tiers []v1alpha1.ServiceTier
	names := map[string]bool{}
	for _, t := range in.Tiers {
		if t.Namespace != p.Namespace || t.Spec.PoolRef.Name != p.Name {
			in.Warnings = append(in.Warnings, fmt.Sprintf("ServiceTier %s/%s belongs to pool %s/%s, not %s/%s: ignored",
				t.Namespace, t.Name, t.Namespace, t.Spec.PoolRef.Name, p.Namespace, p.Name))
			continue
		}
		if names[t.Name] {
			return fmt.Errorf("%w: ServiceTier %s/%s given twice", ErrDuplicate, t.Namespace, t.Name)
		}
		names[t.Name] = true
		tiers = append(tiers, t)
	}
	if len(tiers) == 0 {
		return fmt.Errorf("%w: pool %s/%s has no ServiceTier (pass them with -f, kind: ServiceTier, spec.poolRef.name: %s)", ErrInvalid, p.Namespace, p.Name, p.Name)
	}
	in.Tiers = tiers
	var quotas []v1alpha1.TenantQuota
	qnames := map[string]bool{}
	for _, q := range in.Quotas {
		if q.Namespace != p.Namespace {
			in.Warnings = append(in.Warnings, fmt.Sprintf("TenantQuota %s/%s is not in namespace %s: ignored", q.Namespace, q.Name, p.Namespace))
			continue
		}
		if qnames[q.Name] {
			return fmt.Errorf("%w: TenantQuota %s/%s given twice", ErrDuplicate, q.Namespace, q.Name)
		}
		qnames[q.Name] = true
		quotas = append(quotas, q)
	}
	in.Quotas = quotas
	return nil
}
