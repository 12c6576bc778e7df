package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// lifecycle adds, accepts and finishes one job, one transaction each.
func lifecycle(j *Jobs, id string) error {
	if err := j.Add(ctx, NewJob{Type: typ, ID: id}); err != nil {
		return err
	}
	jobs, err := j.Accept(ctx, typ, AcceptOptions{})
	if err != nil {
		return err
	}
	return j.Finish(ctx, jobs[0], nil)
}

// BenchmarkLifecycle measures full job lifecycles (add, accept, finish), one
// job per call, in one process and in two processes sharing the store.
func BenchmarkLifecycle(b *testing.B) {
	b.Run("1process", func(b *testing.B) {
		j := newJobs(b, Options{})
		b.ResetTimer()
		for i := range b.N {
			if err := lifecycle(j, fmt.Sprint(i)); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
	})
	b.Run("2processes", func(b *testing.B) {
		s, path := newStore(b)
		j := onStore(b, s, Options{})
		// The other process runs as many lifecycles as this one.
		cmd := helper(b, fmt.Sprintf("lifecycles %s %d", path, b.N))
		b.ResetTimer()
		start := time.Now()
		for i := range b.N {
			if err := lifecycle(j, fmt.Sprint(i)); err != nil {
				b.Fatal(err)
			}
		}
		if err := cmd.Wait(); err != nil {
			b.Fatalf("the other process: %v", err)
		}
		b.ReportMetric(float64(2*b.N)/time.Since(start).Seconds(), "jobs/s")
	})
}

// BenchmarkAcceptLatency measures Accept with 100 and with 100,000 jobs
// pending; the queue is topped up after each accept, outside the timing.
func BenchmarkAcceptLatency(b *testing.B) {
	for _, pending := range []int{100, 100_000} {
		b.Run(fmt.Sprintf("pending=%d", pending), func(b *testing.B) {
			j := newJobs(b, Options{})
			fill(b, j, "pre", pending)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				start := time.Now()
				jobs, err := j.Accept(ctx, typ, AcceptOptions{})
				lat = append(lat, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := j.Finish(ctx, jobs[0], nil); err != nil {
					b.Fatal(err)
				}
				mustAdd(b, j, NewJob{ID: fmt.Sprintf("top-%d", i)})
				b.StartTimer()
			}
			reportLatencies(b, lat)
		})
	}
}

// BenchmarkSubscriptionLatency measures the time from the start of an
// update to the subscriber seeing it.
func BenchmarkSubscriptionLatency(b *testing.B) {
	j := newJobs(b, Options{})
	mustAdd(b, j, NewJob{ID: "watched"})
	job := mustAccept(b, j, AcceptOptions{})
	s, err := j.Subscribe(ctx, typ, "watched")
	if err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := j.Update(ctx, job, json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))); err != nil {
			b.Fatal(err)
		}
		for {
			ev, err := s.Next(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if string(ev.Info.Data) == fmt.Sprintf(`{"i":%d}`, i) {
				break
			}
		}
		lat = append(lat, time.Since(start))
	}
	reportLatencies(b, lat)
}

// BenchmarkInsertMany measures bulk inserts in batches of 1,000 jobs.
func BenchmarkInsertMany(b *testing.B) {
	j := newJobs(b, Options{})
	const size = 1000
	b.ResetTimer()
	for i := range b.N {
		batch := make([]NewJob, size)
		for k := range batch {
			batch[k] = NewJob{Type: typ, ID: fmt.Sprintf("%d-%d", i, k)}
		}
		if err := j.AddMany(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "jobs/s")
}

// BenchmarkBurnDown measures draining pending no-op jobs with batch accept
// and batch finish, from 4 goroutines: the comparison with River's
// 200,000-job burn-down.
func BenchmarkBurnDown(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			j := newJobs(b, Options{})
			fill(b, j, "burn", b.N)
			var done atomic.Int64
			b.ResetTimer()
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for {
						jobs, err := j.Accept(ctx, typ, AcceptOptions{Limit: batch})
						if err != nil {
							return // ErrNoJobs: drained
						}
						fin := make([]Done, len(jobs))
						for i, job := range jobs {
							fin[i] = Done{Job: job}
						}
						if _, err := j.FinishMany(ctx, fin); err != nil {
							b.Error(err)
							return
						}
						done.Add(int64(len(jobs)))
					}
				})
			}
			wg.Wait()
			if done.Load() != int64(b.N) {
				b.Fatalf("finished %d of %d", done.Load(), b.N)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
		})
	}
}

// fill adds n pending jobs in batches of 1,000.
func fill(tb testing.TB, j *Jobs, prefix string, n int) {
	tb.Helper()
	for start := 0; start < n; start += 1000 {
		batch := make([]NewJob, 0, 1000)
		for i := start; i < min(n, start+1000); i++ {
			batch = append(batch, NewJob{Type: typ, ID: fmt.Sprintf("%s-%07d", prefix, i)})
		}
		if err := j.AddMany(context.Background(), batch); err != nil {
			tb.Fatal(err)
		}
	}
}

func reportLatencies(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(lat[len(lat)/2]), "p50-µs")
	b.ReportMetric(us(lat[min(len(lat)-1, len(lat)*99/100)]), "p99-µs")
}

// BenchmarkAcceptRanked measures the fair-share scheduler's decision at
// accept time with 100 and 100,000 jobs pending: the queue's head belongs
// to a flooding group, and the acceptor must find a job of the group below
// its share (10 queued at the back) through the queue by group. The
// queue is topped up after each accept, outside the timing. PendingGroups,
// the scheduler's per-interval read, is measured alike.
func BenchmarkAcceptRanked(b *testing.B) {
	rank := func(g string, picked int) int {
		if g == "under" {
			return picked
		}
		return 100
	}
	for _, pending := range []int{100, 100_000} {
		b.Run(fmt.Sprintf("pending=%d", pending), func(b *testing.B) {
			j := newJobs(b, Options{})
			fill(b, j, "flood", pending)
			for i := range 10 {
				mustAdd(b, j, NewJob{ID: fmt.Sprintf("under-%d", i), Group: "under"})
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				start := time.Now()
				got, err := j.Accept(ctx, typ, AcceptOptions{Rank: rank, RankGroups: []string{"under"}})
				lat = append(lat, time.Since(start))
				if err != nil || got[0].Group != "under" {
					b.Fatalf("accepted %v, %v", got, err)
				}
				b.StopTimer()
				if err := j.Finish(ctx, got[0], nil); err != nil {
					b.Fatal(err)
				}
				mustAdd(b, j, NewJob{ID: fmt.Sprintf("under-top-%d", i), Group: "under"})
				b.StartTimer()
			}
			reportLatencies(b, lat)
		})
		b.Run(fmt.Sprintf("PendingGroups/pending=%d", pending), func(b *testing.B) {
			j := newJobs(b, Options{})
			fill(b, j, "flood", pending)
			b.ResetTimer()
			for range b.N {
				if _, err := j.PendingGroups(ctx, typ, 10_000); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
