package budget

import (
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
)

func TestCgroupLimit(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	for name, tc := range map[string]struct {
		files fstest.MapFS
		want  int64
	}{
		"v2 in a cgroup namespace: the root file is the container's": {
			files: fstest.MapFS{"proc/self/cgroup": file("0::/\n"), "sys/fs/cgroup/memory.max": file("536870912\n")},
			want:  512 << 20,
		},
		"v2 max is no limit": {
			files: fstest.MapFS{"proc/self/cgroup": file("0::/\n"), "sys/fs/cgroup/memory.max": file("max\n")},
			want:  0,
		},
		"v2 nested: the smallest of the leaf and its parents": {
			files: fstest.MapFS{
				"proc/self/cgroup":                          file("0::/kubepods/pod1/c1\n"),
				"sys/fs/cgroup/kubepods/pod1/c1/memory.max": file("max\n"),
				"sys/fs/cgroup/kubepods/pod1/memory.max":    file("268435456\n"),
				"sys/fs/cgroup/kubepods/memory.max":         file("1073741824\n"),
			},
			want: 256 << 20,
		},
		"v1 memory controller, unlimited leaf, limited root of the mount": {
			files: fstest.MapFS{
				"proc/self/cgroup": file("5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n"),
				"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": file("9223372036854771712\n"),
				"sys/fs/cgroup/memory/memory.limit_in_bytes":            file("134217728\n"),
			},
			want: 128 << 20,
		},
		"v1 unlimited everywhere (this kind of machine)": {
			files: fstest.MapFS{
				"proc/self/cgroup": file("4:memory:/process_api/x\n0::/\n"),
				"sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": file("9223372036854771712\n"),
				"sys/fs/cgroup/memory/memory.limit_in_bytes":               file("9223372036854771712\n"),
			},
			want: 0,
		},
		"v1 with the memory controller among others": {
			files: fstest.MapFS{
				"proc/self/cgroup":                           file("3:cpuset,memory:/\n"),
				"sys/fs/cgroup/memory/memory.limit_in_bytes": file("1048576\n"),
			},
			want: 1 << 20,
		},
		"no /proc/self/cgroup": {files: fstest.MapFS{}, want: 0},
		"garbage in the files": {
			files: fstest.MapFS{"proc/self/cgroup": file("nonsense\n0::/\n"), "sys/fs/cgroup/memory.max": file("lots\n")},
			want:  0,
		},
	} {
		t.Run(name, func(t *testing.T) {
			if got := CgroupLimit(tc.files); got != tc.want {
				t.Fatalf("CgroupLimit = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestDefaultAndSoftLimit(t *testing.T) {
	type out struct {
		Budget int64
		Why    string
		Soft   int64
	}
	for name, tc := range map[string]struct {
		in   Limits
		want out
	}{
		"nothing known": {Limits{}, out{256 << 20, "no memory limit is known (GOMEMLIMIT, --memory-limit, cgroup): 256 MiB", 0}},
		"the cgroup's limit": {Limits{Cgroup: 512 << 20},
			out{128 << 20, "a quarter of the cgroup memory limit (512 MiB)", 512<<20 - (512<<20)/10}},
		"the chart's limit": {Limits{Container: 1 << 30},
			out{256 << 20, "a quarter of --memory-limit (1 GiB)", 1<<30 - (1<<30)/10}},
		"GOMEMLIMIT, smaller than the container's: it decides and the runtime is left alone": {Limits{GoMemLimit: 400 << 20, Container: 512 << 20},
			out{100 << 20, "a quarter of GOMEMLIMIT (400 MiB)", 0}},
		"the smallest of the container's and the cgroup's": {Limits{Container: 1 << 30, Cgroup: 768 << 20},
			out{192 << 20, "a quarter of the cgroup memory limit (768 MiB)", 768<<20 - (768<<20)/10}},
	} {
		t.Run(name, func(t *testing.T) {
			n, why := Default(tc.in)
			got := out{n, why, SoftLimit(tc.in)}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{
		128 << 20: "128 MiB", 1 << 30: "1 GiB", 1536 << 10: "1536 KiB", 1000: "1000 bytes", 0: "0 bytes", 3 << 30: "3 GiB",
	} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
