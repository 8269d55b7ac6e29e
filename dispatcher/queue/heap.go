package queue

// The runnable-tenant heap: tenants with queued work and a free slot under
// their own limit, ordered by the (key, seq) of their head job. Hand-written
// rather than container/heap so each tenant keeps its index for O(log T)
// fix and removal without interface conversions.

func tenantLess(a, b *tenant) bool {
	if a.hkey != b.hkey {
		return a.hkey < b.hkey
	}
	return a.hseq < b.hseq
}

func (q *Queue) heapSwap(i, j int) {
	h := q.heap
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}

func (q *Queue) heapUp(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !tenantLess(q.heap[i], q.heap[p]) {
			return
		}
		q.heapSwap(i, p)
		i = p
	}
}

// heapDown reports whether the element moved.
func (q *Queue) heapDown(i0 int) bool {
	i, n := i0, len(q.heap)
	for {
		l := 2*i + 1
		if l >= n || l < 0 {
			break
		}
		c := l
		if r := l + 1; r < n && tenantLess(q.heap[r], q.heap[l]) {
			c = r
		}
		if !tenantLess(q.heap[c], q.heap[i]) {
			break
		}
		q.heapSwap(i, c)
		i = c
	}
	return i > i0
}

func (q *Queue) heapPush(t *tenant) {
	t.idx = len(q.heap)
	q.heap = append(q.heap, t)
	q.heapUp(t.idx)
}

func (q *Queue) heapRemove(i int) {
	n := len(q.heap) - 1
	t := q.heap[i]
	if i != n {
		q.heapSwap(i, n)
	}
	q.heap[n] = nil
	q.heap = q.heap[:n]
	t.idx = -1
	if i != n {
		if !q.heapDown(i) {
			q.heapUp(i)
		}
	}
}

func (q *Queue) heapFix(i int) {
	if !q.heapDown(i) {
		q.heapUp(i)
	}
}

func (q *Queue) heapInit() {
	for i := len(q.heap)/2 - 1; i >= 0; i-- {
		q.heapDown(i)
	}
}
