package testutil

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape reads the Prometheus text exposition at url into one value per
// series, keyed `name{l1="v1",...}` with the labels sorted by name (an
// unlabelled series is `name{}`). Counters and gauges give their value,
// a histogram its count as `name_count{...}`; other types are left out.
func Scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scraping %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			pairs := slices.SortedFunc(slices.Values(m.GetLabel()), func(a, b *dto.LabelPair) int {
				return strings.Compare(a.GetName(), b.GetName())
			})
			var lv []string
			for _, l := range pairs {
				lv = append(lv, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			labels := "{" + strings.Join(lv, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				out[name+labels] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[name+labels] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[name+"_count"+labels] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}
