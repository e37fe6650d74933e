/*
 * profile.h — what `tern profile` (cmd_profile.c) and its SVG timeline (profile_svg.c) share: the
 * recorded threads walked as completed spans.
 */
#ifndef TERN_PROFILE_H
#define TERN_PROFILE_H

#include <stdint.h>
#include <stdio.h>

#include "core/trace.h"

/* One completed span of one thread (its B matched with its E; spans left open at the end of a
 * thread's buffer are closed at the thread's last timestamp). */
typedef struct tn_prof_span {
    const tn_trace_ev *b, *e; /* e NULL: closed at the end (truncated)     */
    uint64_t t0, t1;          /* ns                                        */
    uint64_t self;            /* t1 - t0 minus its direct children         */
    int depth;                /* 0 = a root span of its thread             */
} tn_prof_span;

/* Calls fn for every completed span of thread th, children before their parent. */
typedef void (*tn_prof_span_fn)(void *user, const tn_trace_thread *th, const tn_prof_span *s);
void tn_prof_walk(const tn_trace_thread *th, tn_prof_span_fn fn, void *user);

/* Writes an SVG timeline of [t0, t1) (one row per thread, spans coloured by kind at their depth,
 * barrier waits grey, a time axis) titled title; origin is the trace's first timestamp. */
void tn_prof_svg_window(FILE *f, const tn_trace_thread *th, int n_th, uint64_t t0, uint64_t t1, const char *title,
                        double y0);

#endif
