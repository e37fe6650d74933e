/*
 * file.h — read-only file mapping and atomic output files.
 *
 * tn_map: a whole file mapped read-only (MAP_PRIVATE) or, with use_mmap=false, read into memory.
 * Missing/unreadable files fail with TERN_ERR_NOT_FOUND, naming the path and errno text.
 *
 * tn_wfile: output written to "<path>.tmp.<pid>.<n>" in the same directory, then fsync + rename on
 * commit, so the final path is either absent/old or complete. Abort (or any failure) removes the
 * temp file. Write errors are sticky and reported at commit (TERN_ERR_IO naming path and errno).
 * A path that exists and is not a regular file (/dev/null, /dev/full, a FIFO, /dev/stdout) is
 * written in place: a rename would replace the device node itself (as root, /dev/full would
 * become a file). A directory is refused at open.
 */
#ifndef TN_CORE_FILE_H
#define TN_CORE_FILE_H

#include <stdio.h>

#include "core/base.h"

typedef struct tn_map {
    const uint8_t *data;
    size_t size;
    bool mapped; /* true: munmap on close; false: tn_free */
} tn_map;

tern_status tn_map_open(const char *path, bool use_mmap, tn_map *out);
void tn_map_close(tn_map *m);

typedef struct tn_wfile {
    FILE *f;
    char *path;
    char *tmp_path;
    tern_status err; /* first failure, sticky */
    char err_msg[256];
    uint64_t written;
    bool direct; /* written in place (not a regular file): no temp, no rename */
} tn_wfile;

tern_status tn_wfile_open(const char *path, tn_wfile *w);
void tn_wfile_write(tn_wfile *w, const void *data, size_t n);
void tn_wfile_pad(tn_wfile *w, size_t n); /* n zero bytes */
/* fsync, rename over path, fsync directory. On failure the temp file is removed. */
tern_status tn_wfile_commit(tn_wfile *w);
void tn_wfile_abort(tn_wfile *w);

/* Same file (inode) check used to refuse in == out. */
bool tn_same_file(const char *a, const char *b);

#endif
