package capacity

import (
	"fmt"
	"math"
	"math/big"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

// loadResolution is how finely an offered load is read: 10⁻⁶ requests per
// second. Rates arrive as float64s; rounding each to this grid first makes
// 0.1 req/s exactly 1/10, so ceil(0.1 × 10s / 1) is 1 and never 2.
const loadResolution = 1_000_000

// DemandInput is what DesiredReplicas depends on.
type DemandInput struct {
	// Pool supplies concurrencyPerReplica and spec.autoscaling. Without
	// autoscaling the result is clamped to [0, 2³¹−1] only and the target
	// utilization is DefaultTargetUtilization.
	Pool *v1alpha1.ModelPool
	// ServiceTime is the effective S, as Bounds.Pool.ServiceTime.
	ServiceTime time.Duration
	// Reports are the stats of every dispatcher's last acknowledgement.
	// Each dispatcher reports its own arrivals and its own queue, so they
	// add up, in Local and Redis mode alike.
	Reports []policy.Measured
}

// Demand is the offered load and the replicas it needs.
type Demand struct {
	// OfferedLoad is λ, the requests per second over every dispatcher and
	// tier, on the 10⁻⁶ grid; OfferedLoadString has at most three
	// decimals.
	OfferedLoad       float64
	OfferedLoadString string
	// Queued is the requests queued or held over every dispatcher.
	Queued int64
	// Needed is ceil(λ × S / (C × targetUtilization)) before the clamps,
	// saturated at the int32 range.
	Needed int64
	// Replicas is Needed, at least 1 while Queued > 0, clamped to
	// spec.autoscaling's [minReplicas, maxReplicas] when set: what
	// status.desiredReplicas and tiergate_pool_desired_replicas show.
	Replicas int32
}

// DesiredReplicas applies Little's law to the dispatchers' reports: λ
// requests per second that each hold a slot for S keep λ × S slots busy,
// and a replica offers C of them, of which targetUtilization should be
// busy. Errors wrap ErrInvalidInput. The input is not modified.
func DesiredReplicas(in DemandInput) (Demand, error) {
	if err := validateDemand(in); err != nil {
		return Demand{}, err
	}
	spec := in.Pool.Spec
	ApplyDefaults(&spec)
	util := shareRat(resource.MustParse(DefaultTargetUtilization))
	if spec.Autoscaling != nil {
		util = shareRat(*spec.Autoscaling.TargetUtilization)
	}
	micro, queued := sumReports(in.Reports)
	lambda := new(big.Rat).SetFrac(big.NewInt(micro), big.NewInt(loadResolution))
	// ceil(λ × S / (C × u)) with λ = micro/10⁶, S in ns and u = p/q.
	num := new(big.Int).Mul(big.NewInt(micro), big.NewInt(int64(in.ServiceTime)))
	num.Mul(num, util.Denom())
	den := new(big.Int).Mul(big.NewInt(loadResolution*int64(time.Second)), big.NewInt(int64(spec.ConcurrencyPerReplica)))
	den.Mul(den, util.Num())
	needed := min(ceilDiv(num, den), maxInt32)

	d := Demand{Queued: queued, Needed: needed, OfferedLoadString: decimalString(lambda, 3)}
	d.OfferedLoad, _ = lambda.Float64()
	replicas := needed
	if queued > 0 {
		replicas = max(replicas, 1)
	}
	if a := spec.Autoscaling; a != nil {
		replicas = min(max(replicas, int64(a.MinReplicas)), int64(a.MaxReplicas))
	}
	d.Replicas = int32(replicas)
	return d, nil
}

// sumReports adds the offered loads, in millionths of a request per
// second, and the queued counts. A rate that is not a finite number > 0 is
// left out: a broken report must not scale the pool. The sums saturate.
func sumReports(reports []policy.Measured) (micro, queued int64) {
	const most = math.MaxInt64 / 2
	for _, r := range reports {
		for _, v := range r.OfferedLoad {
			if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
				continue
			}
			m := int64(most)
			if x := v * loadResolution; x < most {
				m = int64(math.Round(x))
			}
			micro = min(micro+m, most)
		}
		if r.Queued > 0 {
			queued = min(queued+r.Queued, most)
		}
	}
	return micro, queued
}

func validateDemand(in DemandInput) error {
	if in.Pool == nil {
		return fmt.Errorf("%w: no pool", ErrInvalidInput)
	}
	var errs []string
	if in.Pool.Spec.ConcurrencyPerReplica < 1 {
		errs = append(errs, fmt.Sprintf("spec.concurrencyPerReplica: %d must be at least 1", in.Pool.Spec.ConcurrencyPerReplica))
	}
	if in.ServiceTime <= 0 {
		errs = append(errs, fmt.Sprintf("serviceTime: %s must be greater than 0", in.ServiceTime))
	}
	errs = append(errs, validateAutoscaling(in.Pool.Spec.Autoscaling)...)
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidInput, strings.Join(errs, "; "))
	}
	return nil
}
