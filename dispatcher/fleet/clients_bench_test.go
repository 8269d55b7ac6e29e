package fleet

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkAdmitReleaseClients is fleet mode's admission throughput: n
// concurrent clients, each looping Admit, Wait, Release against one queue
// behind a Gate on a real redis-server. ns/op is per request, so the ratio
// of clients=1 to clients=16 is how much more one dispatcher admits when 16
// requests arrive at once.
func BenchmarkAdmitReleaseClients(b *testing.B) {
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			q := benchQueue(b, "redis")
			b.ReportAllocs()
			b.ResetTimer()
			var left atomic.Int64
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			for range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx := context.Background()
					for left.Add(-1) >= 0 {
						h, err := q.Admit("a", "standard")
						if err != nil {
							b.Error(err)
							return
						}
						if err := h.Wait(ctx); err != nil {
							b.Error(err)
							return
						}
						h.Release()
					}
				}()
			}
			wg.Wait()
		})
	}
}
