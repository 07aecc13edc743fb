package runtime

import (
	"context"
	"fmt"
	"net"
	"os"
	goruntime "runtime"

	"golang.org/x/sys/unix"
)

// dialInNetns dials addr from inside the network namespace of process pid. The socket is created
// while the calling OS thread has joined that namespace and keeps living there; the thread then
// returns to its own namespace. If it cannot, the thread stays locked and Go retires it with the
// goroutine, so no goroutine ever runs in a sandbox's namespace by accident.
func dialInNetns(ctx context.Context, pid int, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			goruntime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("runtime: open own netns: %w", err)}
			return
		}
		defer self.Close()
		target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			goruntime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("runtime: open sandbox netns: %w", err)}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			goruntime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("runtime: enter sandbox netns: %w", err)}
			return
		}
		var d net.Dialer
		conn, dialErr := d.DialContext(ctx, "tcp", addr)
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: it dies with this goroutine.
			if conn != nil {
				conn.Close()
			}
			ch <- result{err: fmt.Errorf("runtime: leave sandbox netns: %w", err)}
			return
		}
		goruntime.UnlockOSThread()
		ch <- result{conn: conn, err: dialErr}
	}()
	r := <-ch
	return r.conn, r.err
}
