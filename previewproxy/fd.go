package previewproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrDialRefused is returned when sandboxd could not reach the sandbox port.
var ErrDialRefused = fmt.Errorf("sandbox port: %w", syscall.ECONNREFUSED)

// FDSocket returns the descriptor-passing socket of a stream socket path (<id>-<port>.sock).
func FDSocket(streamSocket string) (string, bool) {
	base, ok := strings.CutSuffix(streamSocket, ".sock")
	if !ok || strings.HasSuffix(base, ".fd") {
		return "", false
	}
	return base + ".fd.sock", true
}

// DialFD asks sandboxd's descriptor-passing socket for a connection to a sandbox port and returns
// the connected TCP socket itself: after this, bytes flow between the edge and the sandbox's server
// with no process in between.
func DialFD(ctx context.Context, socket string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		_ = uc.SetDeadline(dl)
	}
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("receive sandbox connection: %w", err)
	}
	if n != 1 || buf[0] != 'S' || oobn == 0 {
		return nil, ErrDialRefused
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, errors.New("receive sandbox connection: bad control message")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return nil, errors.New("receive sandbox connection: no descriptor")
	}
	f := os.NewFile(uintptr(fds[0]), "sandbox-conn")
	defer f.Close()
	conn, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("receive sandbox connection: %w", err)
	}
	return conn, nil
}
