package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"
)

// File errors the API maps to its error model.
var (
	ErrBadPath  = errors.New("invalid path")
	ErrNoFile   = errors.New("no such file or folder")
	ErrTooLarge = errors.New("file too large")
	ErrIsDir    = errors.New("is a folder")
)

// FileInfo describes an entry of a workspace folder.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Type    string    `json:"type"` // file, dir, symlink, other
	Size    int64     `json:"size"`
	ModTime time.Time `json:"modTime"`
}

// cleanPath validates a path relative to /workspace. It refuses rather than repairs: absolute paths,
// "..", empty or "." segments, backslashes and NUL are errors, never rewritten into something valid.
func cleanPath(p string) (string, error) {
	if p == "" {
		return ".", nil
	}
	if strings.HasPrefix(p, "/") || strings.ContainsAny(p, "\\\x00") || len(p) > 4096 {
		return "", fmt.Errorf("%w: %q (paths are relative to /workspace, without .. or backslashes)", ErrBadPath, p)
	}
	for _, seg := range strings.Split(strings.TrimSuffix(p, "/"), "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", fmt.Errorf("%w: %q (paths are relative to /workspace, without .. or empty segments)", ErrBadPath, p)
		}
	}
	return path.Clean(p), nil
}

// openRoot opens the session's workspace as an os.Root: every access below is confined to it, with
// symlinks that lead outside (absolute, or through ..) refused by the kernel-assisted walk.
func (m *Manager) openRoot(ctx context.Context, owner, id string) (*os.Root, error) {
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(m.rt.WorkspacePath(id))
	if err != nil {
		return nil, fmt.Errorf("%w: the session has no workspace", ErrNoFile)
	}
	return root, nil
}

func mapFSErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return ErrNoFile
	case strings.Contains(err.Error(), "path escapes from parent"):
		return fmt.Errorf("%w: it leads outside /workspace", ErrBadPath)
	case errors.Is(err, fs.ErrInvalid):
		return ErrBadPath
	default:
		return err
	}
}

// ReadFile opens a file of the workspace, or lists a folder (list non-nil).
func (m *Manager) ReadFile(ctx context.Context, owner, id, p string) (f *os.File, list []FileInfo, err error) {
	rel, err := cleanPath(p)
	if err != nil {
		return nil, nil, err
	}
	root, err := m.openRoot(ctx, owner, id)
	if err != nil {
		return nil, nil, err
	}
	defer root.Close()
	fi, err := root.Stat(rel)
	if err != nil {
		return nil, nil, mapFSErr(err)
	}
	if fi.IsDir() {
		dir, err := root.OpenRoot(rel)
		if err != nil {
			return nil, nil, mapFSErr(err)
		}
		defer dir.Close()
		d, err := dir.Open(".")
		if err != nil {
			return nil, nil, mapFSErr(err)
		}
		defer d.Close()
		entries, err := d.ReadDir(10000)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, nil, err
		}
		list = make([]FileInfo, 0, len(entries))
		for _, e := range entries {
			info, err := e.Info()
			if err != nil {
				continue
			}
			typ := "other"
			switch {
			case e.Type()&fs.ModeSymlink != 0:
				typ = "symlink"
			case e.IsDir():
				typ = "dir"
			case e.Type().IsRegular():
				typ = "file"
			}
			list = append(list, FileInfo{Name: e.Name(), Path: path.Join(rel, e.Name()), Type: typ, Size: info.Size(), ModTime: info.ModTime()})
		}
		return nil, list, nil
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%w: not a regular file", ErrBadPath)
	}
	f, err = root.Open(rel)
	if err != nil {
		return nil, nil, mapFSErr(err)
	}
	return f, nil, nil
}

// WriteFile writes a file of the workspace from body, at most max bytes, creating its folders. The
// file is written to a temporary name and renamed, so a refused upload leaves nothing behind and
// never truncates the file it would have replaced.
func (m *Manager) WriteFile(ctx context.Context, owner, id, p string, body io.Reader, max int64, uid, gid int) (int64, error) {
	rel, err := cleanPath(p)
	if err != nil {
		return 0, err
	}
	if rel == "." {
		return 0, fmt.Errorf("%w: name a file", ErrBadPath)
	}
	root, err := m.openRoot(ctx, owner, id)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	if dir := path.Dir(rel); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return 0, mapFSErr(err)
		}
		// Folders made here belong to the sandbox user, like everything in /workspace.
		parts := strings.Split(dir, "/")
		for i := range parts {
			_ = root.Lchown(strings.Join(parts[:i+1], "/"), uid, gid)
		}
	}
	if fi, err := root.Lstat(rel); err == nil && fi.IsDir() {
		return 0, fmt.Errorf("%w: %s", ErrIsDir, rel)
	}
	tmp := path.Join(path.Dir(rel), fmt.Sprintf(".porthole-upload-%d", time.Now().UnixNano()))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, mapFSErr(err)
	}
	n, err := io.Copy(f, io.LimitReader(body, max+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > max {
		err = fmt.Errorf("%w: over %d bytes", ErrTooLarge, max)
	}
	if err == nil {
		err = root.Lchown(tmp, uid, gid)
	}
	if err == nil {
		err = root.Rename(tmp, rel)
	}
	if err != nil {
		_ = root.Remove(tmp)
		if errors.Is(err, ErrTooLarge) {
			return n, err
		}
		if strings.Contains(err.Error(), "no space left") {
			return n, fmt.Errorf("%w: the workspace is full", ErrTooLarge)
		}
		return n, mapFSErr(err)
	}
	_ = m.store.TouchSession(ctx, id, time.Now(), "")
	return n, nil
}

// DeleteFile removes a file, or a folder with everything in it.
func (m *Manager) DeleteFile(ctx context.Context, owner, id, p string) error {
	rel, err := cleanPath(p)
	if err != nil {
		return err
	}
	if rel == "." {
		return fmt.Errorf("%w: refusing to delete /workspace itself", ErrBadPath)
	}
	root, err := m.openRoot(ctx, owner, id)
	if err != nil {
		return err
	}
	defer root.Close()
	if _, err := root.Lstat(rel); err != nil {
		return mapFSErr(err)
	}
	return mapFSErr(root.RemoveAll(rel))
}
