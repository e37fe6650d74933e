/*
 * file.c — see file.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"

tern_status tn_map_open(const char *path, bool use_mmap, tn_map *out) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tn_err(TERN_ERR_NOT_FOUND, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tn_err(TERN_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return tn_err(TERN_ERR_NOT_FOUND, "'%s' is a directory, not a file", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tn_err(TERN_ERR_NOT_FOUND, "'%s' is not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    out->size = size;
    if (size == 0) {
        close(fd);
        out->data = (const uint8_t *)"";
        return TERN_OK;
    }
    if (use_mmap) {
        void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p != MAP_FAILED) {
            close(fd);
            out->data = p;
            out->mapped = true;
            return TERN_OK;
        }
    }
    uint8_t *buf = tn_malloc_aligned(size, 64);
    if (!buf) {
        close(fd);
        return tn_err(TERN_ERR_NOMEM, "cannot allocate %zu bytes to read '%s'", size, path);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            close(fd);
            tn_free_aligned(buf);
            return tn_err(TERN_ERR_IO, "read of '%s' failed at offset %zu: %s", path, got, e ? strerror(e) : "unexpected end of file");
        }
        got += (size_t)r;
    }
    close(fd);
    out->data = buf;
    return TERN_OK;
}

void tn_map_close(tn_map *m) {
    if (!m || !m->data) return;
    if (m->mapped) munmap((void *)m->data, m->size);
    else if (m->size) tn_free_aligned((void *)m->data);
    memset(m, 0, sizeof *m);
}

static atomic_uint tn_tmp_counter;

static void tn_wfile_fail(tn_wfile *w, tern_status s, const char *what, int e) {
    if (w->err) return;
    w->err = s;
    snprintf(w->err_msg, sizeof w->err_msg, "%s: %s", what, strerror(e));
}

tern_status tn_wfile_open(const char *path, tn_wfile *w) {
    memset(w, 0, sizeof *w);
    size_t n = strlen(path) + 64;
    w->path = tn_strdup(path);
    w->tmp_path = tn_malloc(n);
    if (!w->path || !w->tmp_path) {
        tn_free(w->path);
        tn_free(w->tmp_path);
        memset(w, 0, sizeof *w);
        return tn_err(TERN_ERR_NOMEM, "out of memory opening '%s'", path);
    }
    struct stat st;
    const bool exists = stat(path, &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) {
        tn_free(w->path);
        tn_free(w->tmp_path);
        memset(w, 0, sizeof *w);
        return tn_err(TERN_ERR_IO, "cannot write '%s': it is a directory", path);
    }
    w->direct = exists && !S_ISREG(st.st_mode);
    if (w->direct) snprintf(w->tmp_path, n, "%s", path); /* a device or FIFO: in place */
    else snprintf(w->tmp_path, n, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&tn_tmp_counter, 1));
    int fd = w->direct ? open(path, O_WRONLY | O_CLOEXEC) : open(w->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        tern_status s = tn_err(TERN_ERR_IO, "cannot create '%s': %s", w->tmp_path, strerror(e));
        tn_free(w->path);
        tn_free(w->tmp_path);
        memset(w, 0, sizeof *w);
        return s;
    }
    w->f = fdopen(fd, "wb");
    if (!w->f) {
        close(fd);
        if (!w->direct) unlink(w->tmp_path);
        tn_free(w->path);
        tn_free(w->tmp_path);
        memset(w, 0, sizeof *w);
        return tn_err(TERN_ERR_NOMEM, "fdopen failed for '%s'", path);
    }
    return TERN_OK;
}

void tn_wfile_write(tn_wfile *w, const void *data, size_t n) {
    if (w->err || !n) return;
    if (fwrite(data, 1, n, w->f) != n) tn_wfile_fail(w, TERN_ERR_IO, "write failed", errno);
    else w->written += n;
}

void tn_wfile_pad(tn_wfile *w, size_t n) {
    static const uint8_t zeros[256];
    while (n > 0 && !w->err) {
        size_t k = TN_MIN(n, sizeof zeros);
        tn_wfile_write(w, zeros, k);
        n -= k;
    }
}

static void tn_wfile_release(tn_wfile *w) {
    tn_free(w->path);
    tn_free(w->tmp_path);
    w->path = w->tmp_path = NULL;
    w->f = NULL;
}

void tn_wfile_abort(tn_wfile *w) {
    if (!w->tmp_path) return;
    if (w->f) fclose(w->f);
    if (!w->direct) unlink(w->tmp_path);
    tn_wfile_release(w);
}

tern_status tn_wfile_commit(tn_wfile *w) {
    if (!w->tmp_path) return tn_err(TERN_ERR_STATE, "output file already closed");
    if (!w->err && fflush(w->f) != 0) tn_wfile_fail(w, TERN_ERR_IO, "write failed", errno);
    /* devices and pipes may not support fsync (EINVAL, ENOTSUP): nothing to make durable there */
    if (!w->err && fsync(fileno(w->f)) != 0 && !(w->direct && (errno == EINVAL || errno == ENOTSUP || errno == EROFS)))
        tn_wfile_fail(w, TERN_ERR_IO, "fsync failed", errno);
    if (fclose(w->f) != 0 && !w->err) tn_wfile_fail(w, TERN_ERR_IO, "close failed", errno);
    w->f = NULL;
    if (!w->err && !w->direct && rename(w->tmp_path, w->path) != 0) tn_wfile_fail(w, TERN_ERR_IO, "rename failed", errno);
    if (w->err) {
        tern_status s = tn_err(w->err, "writing '%s' (%llu bytes written): %s", w->path, (unsigned long long)w->written, w->err_msg);
        if (!w->direct) unlink(w->tmp_path);
        tn_wfile_release(w);
        return s;
    }
    if (w->direct) {
        tn_wfile_release(w);
        return TERN_OK;
    }
    /* Make the rename durable. */
    char *dir = tn_strdup(w->path);
    if (dir) {
        int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        tn_free(dir);
    }
    tn_wfile_release(w);
    return TERN_OK;
}

bool tn_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) != 0 || stat(b, &sb) != 0) return false;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}
