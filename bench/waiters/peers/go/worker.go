// A worker process of ../driver.py for the Go peer: `waiters` waiters on one key, each a
// goroutine with a clientv3.Client, a concurrency.Session and a concurrency.Mutex of its own,
// all on the same prefix. Speaks driver.py's worker protocol: prints {"ev":"ready"} once every
// waiter is connected and warmed up, reads "start <ns>" (a CLOCK_MONOTONIC instant) and then
// "stop", and prints its {"ev":"result"} line.
//
//	worker --peer go-concurrency-mutex --url http://127.0.0.1:PORT --waiters N --counter FILE
//	       [--requeue after-handover|at-once]
//	worker --version
//
// The Mutex is etcd's own (go.etcd.io/etcd/clientv3/concurrency, unchanged). What it does is
// counted on the waiter's client, whose KV and Watcher are wrapped (the Mutex reaches the server
// only through them):
//   - attempts: the Get ranges of a Lock() after its first. Lock() makes one Txn (put the
//     waiter's key, read the oldest key), then, when it must wait, one Get for the newest key
//     created before its own, watches that key until it is deleted, and Gets again. The first
//     Get follows the Txn at once; each later one follows a watch's end.
//   - wake-ups: the watch responses the Mutex receives while it waits. Counting them relays the
//     watch channel through one more goroutine.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
	"go.etcd.io/etcd/version"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/grpclog"
)

// The prefix of the Mutex (it adds "/"), and the session's lease, as the other peers' key and
// lease.
const (
	key   = "waiters-bench"
	ttlS  = 30
	batch = 50
)

// monoNs is CLOCK_MONOTONIC, which driver.py and the other workers read too.
func monoNs() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

func sleepUntil(ns int64) {
	if d := ns - monoNs(); d > 0 {
		time.Sleep(time.Duration(d))
	}
}

func readCounter(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return n
}

// stats are counted only while the window is open.
type stats struct {
	open     atomic.Bool
	attempts atomic.Int64
	wakeups  atomic.Int64
}

// countingKV counts the Get ranges of its waiter's current Lock().
type countingKV struct {
	clientv3.KV
	gets *int
}

func (k countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	*k.gets++
	return k.KV.Get(ctx, key, opts...)
}

// countingWatcher relays each watch of the Mutex, counting the responses it delivers.
type countingWatcher struct {
	clientv3.Watcher
	st *stats
}

func (w countingWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	in := w.Watcher.Watch(ctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for r := range in {
			if w.st.open.Load() {
				w.st.wakeups.Add(1)
			}
			select {
			case out <- r:
			case <-ctx.Done():
				// The Mutex stopped reading: drain until the client closes the channel.
			}
		}
	}()
	return out
}

type waiter struct {
	client *clientv3.Client
	mutex  *concurrency.Mutex
	gets   int
}

func connect(url string, st *stats) (*waiter, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 120 * time.Second})
	if err != nil {
		return nil, err
	}
	w := &waiter{client: c}
	c.KV = countingKV{KV: c.KV, gets: &w.gets}
	c.Watcher = countingWatcher{Watcher: c.Watcher, st: st}
	s, err := concurrency.NewSession(c, concurrency.WithTTL(ttlS))
	if err != nil {
		return nil, err
	}
	w.mutex = concurrency.NewMutex(s, key)
	return w, nil
}

// lock is one Lock() with its attempts counted (only this waiter's goroutine uses w.gets).
func (w *waiter) lock(st *stats) error {
	w.gets = 0
	err := w.mutex.Lock(context.Background())
	if st.open.Load() && w.gets > 1 {
		st.attempts.Add(int64(w.gets - 1))
	}
	return err
}

func (w *waiter) unlock() error { return w.mutex.Unlock(context.Background()) }

func cpuS() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func emit(v map[string]any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	os.Stdout.Write(append(b, '\n'))
}

func main() {
	_ = flag.String("peer", "go-concurrency-mutex", "the peer (this worker has one)")
	url := flag.String("url", "", "the etcd endpoint, http://127.0.0.1:PORT")
	n := flag.Int("waiters", 1, "waiters in this process")
	counter := flag.String("counter", "", "the counter file every holder increments")
	requeue := flag.String("requeue", "after-handover", "after-handover or at-once")
	showVersion := flag.Bool("version", false, "print the client's version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Printf("go.etcd.io/etcd/clientv3 %s (%s)\n", version.Version, runtime.Version())
		return
	}
	// The gRPC library's reconnection notices would interleave with the protocol's lines.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(discard{}, discard{}, os.Stderr))

	st := &stats{}
	ws := make([]*waiter, *n)
	var errMu sync.Mutex
	var connectErr error
	// Connecting sessions one after the other takes long: in parallel, in batches.
	for b := 0; b < *n; b += batch {
		var wg sync.WaitGroup
		for i := b; i < *n && i < b+batch; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				w, err := connect(*url, st)
				errMu.Lock()
				defer errMu.Unlock()
				if err != nil && connectErr == nil {
					connectErr = err
				}
				ws[i] = w
			}(i)
		}
		wg.Wait()
	}
	if connectErr != nil {
		emit(map[string]any{"ev": "failed", "error": "connect: " + connectErr.Error()})
		os.Exit(1)
	}
	// A warm-up hold for each waiter (connections, the first watch stream), serial.
	for _, w := range ws {
		if err := w.lock(st); err != nil {
			emit(map[string]any{"ev": "failed", "error": "warm-up: " + err.Error()})
			os.Exit(1)
		}
		if err := w.unlock(); err != nil {
			emit(map[string]any{"ev": "failed", "error": "warm-up: " + err.Error()})
			os.Exit(1)
		}
	}
	emit(map[string]any{"ev": "ready"})
	in := bufio.NewReader(os.Stdin)
	line, _ := in.ReadString('\n')
	f := strings.Fields(line)
	if len(f) != 2 || f[0] != "start" {
		emit(map[string]any{"ev": "failed", "error": fmt.Sprintf("expected start, got %q", line)})
		os.Exit(1)
	}
	start, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		panic(err)
	}

	var mu sync.Mutex
	stopped, inCS := false, 0
	holds := [][4]int64{}
	nErrors, firstError := 0, ""
	fail := func(what string) {
		mu.Lock()
		defer mu.Unlock()
		nErrors++
		if firstError == "" {
			firstError = what
		}
	}
	isStopped := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return stopped
	}

	run := func(i int) {
		w := ws[i]
		sleepUntil(start)
		for {
			t0 := monoNs()
			if err := w.lock(st); err != nil {
				fail("acquire: " + err.Error())
				time.Sleep(10 * time.Millisecond)
				continue
			}
			t1 := monoNs()
			mu.Lock()
			if stopped {
				mu.Unlock()
				_ = w.unlock()
				return
			}
			inCS++
			mu.Unlock()
			c := readCounter(*counter) + 1
			if err := os.WriteFile(*counter, []byte(strconv.Itoa(c)), 0o644); err != nil {
				fail("counter: " + err.Error())
			}
			if *requeue == "after-handover" && c > 1 {
				// Hold until the previous holder has queued again (driver.py does the same).
				marker := fmt.Sprintf("%s.q%d", *counter, c-1)
				until := time.Now().Add(50 * time.Millisecond)
				for time.Now().Before(until) {
					if _, err := os.Stat(marker); err == nil {
						break
					}
					time.Sleep(200 * time.Microsecond)
				}
			}
			t2 := monoNs()
			if err := w.unlock(); err != nil {
				fail("release: " + err.Error())
			}
			mu.Lock()
			holds = append(holds, [4]int64{t0, t1, t2, int64(i)})
			inCS--
			mu.Unlock()
			if *requeue == "after-handover" {
				// Queue again once another waiter holds the key (driver.py does the same).
				for readCounter(*counter) == c && !isStopped() {
					time.Sleep(500 * time.Microsecond)
				}
				if err := os.WriteFile(fmt.Sprintf("%s.q%d", *counter, c), nil, 0o644); err != nil {
					fail("marker: " + err.Error())
				}
			}
		}
	}

	sleepUntil(start)
	st.open.Store(true)
	cpu0 := cpuS()
	for i := range ws {
		go run(i)
	}
	_, _ = in.ReadString('\n') // the coordinator's stop (or EOF)
	cpu1 := cpuS()
	st.open.Store(false)
	mu.Lock()
	stopped = true
	mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		busy := inCS > 0
		mu.Unlock()
		if !busy {
			break
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	var fe any
	if firstError != "" {
		fe = firstError
	}
	emit(map[string]any{
		"ev": "result", "holds": holds, "cpu_s": cpu1 - cpu0,
		"attempts": st.attempts.Load(), "wakeups": st.wakeups.Load(),
		"errors": nErrors, "first_error": fe,
	})
	mu.Unlock()
	// Waiters still blocked in Lock() are left behind.
	os.Exit(0)
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
