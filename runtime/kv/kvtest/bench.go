package kvtest

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// Bench measures a backend: write transactions of one and of ten keys, a
// range read of 1,000 keys, and watch wake-up latency in one process and
// across processes, each alone and beside 4 concurrent writers.
func Bench(b *testing.B, be Backend) {
	b.Run("Write1", func(b *testing.B) { benchWrite(b, be, 1, 1) })
	b.Run("Write10", func(b *testing.B) { benchWrite(b, be, 10, 1) })
	b.Run("Write1x4Writers", func(b *testing.B) { benchWrite(b, be, 1, 4) })
	b.Run("Write10x4Writers", func(b *testing.B) { benchWrite(b, be, 10, 4) })
	b.Run("RangeRead1000", func(b *testing.B) { benchRange(b, be) })
	b.Run("WatchInProcess", func(b *testing.B) { benchWatchInProcess(b, be, 0) })
	b.Run("WatchInProcessWith4Writers", func(b *testing.B) { benchWatchInProcess(b, be, 4) })
	b.Run("WatchCrossProcess", func(b *testing.B) { benchWatchCrossProcess(b, be, 0) })
	b.Run("WatchCrossProcessWith4Writers", func(b *testing.B) { benchWatchCrossProcess(b, be, 4) })
}

// benchWrite commits transactions of keys small writes each from writers
// goroutines, and reports transactions per second.
func benchWrite(b *testing.B, be Backend, keys, writers int) {
	s, _ := be.Open(b)
	sub := NewSubspace(b, s)
	value := []byte("0123456789abcdef")
	var next sync.Mutex
	i := 0
	claim := func() (int, bool) {
		next.Lock()
		defer next.Unlock()
		if i >= b.N {
			return 0, false
		}
		i++
		return i, true
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for {
				n, ok := claim()
				if !ok {
					return
				}
				if _, err := s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
					for k := range keys {
						tx.Set(sub.Pack(tuple.Tuple{w, n, k}), value)
					}
					return nil, nil
				}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tx/s")
}

func benchRange(b *testing.B, be Backend) {
	s, _ := be.Open(b)
	sub := NewSubspace(b, s)
	value := make([]byte, 100)
	transact(b, s, func(tx kv.Tx) (any, error) {
		for i := range 1000 {
			tx.Set(sub.Pack(tuple.Tuple{i}), value)
		}
		return nil, nil
	})
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		v, err := s.ReadTransact(context.Background(), func(tx kv.ReadTx) (any, error) {
			return tx.GetRange(sub.Range(), kv.RangeOptions{})
		})
		if err != nil || len(v.([]kv.KeyValue)) != 1000 {
			b.Fatalf("range read: %v", err)
		}
	}
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "keys/s")
}

// background runs n writers committing small transactions until the
// returned stop function is called.
func background(b *testing.B, s kv.Store, sub kv.Subspace, n int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				s.Transact(ctx, func(tx kv.Tx) (any, error) {
					tx.Set(sub.Pack(tuple.Tuple{"load", w, i % 1000}), []byte("x"))
					return nil, nil
				})
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

// reportLatencies reports the median and 99th percentile in microseconds.
func reportLatencies(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(lat[len(lat)/2]), "p50-µs")
	b.ReportMetric(us(lat[min(len(lat)-1, len(lat)*99/100)]), "p99-µs")
}

// benchWatchInProcess measures the time from the start of a commit that
// changes a key to the moment a goroutine waiting on its watch wakes.
func benchWatchInProcess(b *testing.B, be Backend, writers int) {
	s, _ := be.Open(b)
	sub := NewSubspace(b, s)
	k := sub.Pack(tuple.Tuple{"watched"})
	defer background(b, s, sub, writers)()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		w := watchKey(b, s, k)
		woke := make(chan time.Time, 1)
		go func() {
			<-w.Done()
			woke <- time.Now()
		}()
		start := time.Now()
		Set(b, s, k, []byte(strconv.Itoa(i)))
		select {
		case t := <-woke:
			lat = append(lat, t.Sub(start))
		case <-time.After(10 * time.Second):
			b.Fatal("watch did not fire")
		}
	}
	reportLatencies(b, lat)
}

// benchWatchCrossProcess measures the time from the start of a commit in
// this process to the wake-up of a watch in a helper process, which stamps
// its wall-clock wake time into its answer.
func benchWatchCrossProcess(b *testing.B, be Backend, writers int) {
	s, spec := be.Open(b)
	sub := NewSubspace(b, s)
	echo := startChild(b, orders{Role: "echo", Spec: spec, Prefix: sub.Bytes()})
	if l := echo.line(30 * time.Second); l != "ready" {
		b.Fatalf("helper said %q", l)
	}
	defer background(b, s, sub, writers)()
	ping, pong := sub.Pack(tuple.Tuple{"ping"}), sub.Pack(tuple.Tuple{"pong"})
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		w := watchKey(b, s, pong)
		start := time.Now()
		Set(b, s, ping, []byte(strconv.Itoa(i)))
		if !waitFired(w, 10*time.Second) {
			b.Fatal("no answer from the helper process")
		}
		fields := strings.Fields(string(Get(b, s, pong)))
		if len(fields) != 2 || fields[1] != strconv.Itoa(i) {
			b.Fatalf("round %d: pong = %q", i, fields)
		}
		woke, _ := strconv.ParseInt(fields[0], 10, 64)
		lat = append(lat, time.Unix(0, woke).Sub(start))
	}
	b.StopTimer()
	Set(b, s, ping, []byte("stop"))
	reportLatencies(b, lat)
}
