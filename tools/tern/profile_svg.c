/*
 * profile_svg.c — the SVG timeline of `tern profile --svg`: one window of time (a forward pass),
 * one row per thread, ops coloured by kind (barrier waits grey) drawn outer spans first so the
 * innermost op shows, layers as a labelled band above, a time axis in µs. Self-contained SVG (no
 * scripts, no external fonts), every rect with a <title> tooltip.
 */
#include <string.h>

#include "profile.h"

#define SVG_W 1000.0
#define SVG_LEFT 80.0  /* thread names */
#define SVG_RIGHT 20.0
#define SVG_ROW 26.0
#define SVG_TOP 38.0   /* title and axis labels above the rows */

static const char *svg_colour(int kind) {
    switch (kind) {
    case TN_TK_MATMUL: return "#4e79a7";
    case TN_TK_QUANT: return "#76b7b2";
    case TN_TK_ATTENTION: return "#e15759";
    case TN_TK_ROPE: return "#f28e2b";
    case TN_TK_NORM: return "#59a14f";
    case TN_TK_OUTPUT: return "#b07aa1";
    case TN_TK_EMBED: return "#edc948";
    case TN_TK_SAMPLE: return "#ff9da7";
    case TN_TK_BARRIER: return "#bab0ac";
    default: return NULL; /* phases, forward, layers: not drawn as ops */
    }
}

typedef struct {
    FILE *f;
    uint64_t t0, t1;
    double y, scale;
    int depth; /* draw only spans of this depth in this pass */
    int max_depth;
} svg_ctx;

static double svg_x(const svg_ctx *C, uint64_t t) {
    const uint64_t c = t < C->t0 ? C->t0 : t > C->t1 ? C->t1 : t;
    return SVG_LEFT + (double)(c - C->t0) * C->scale;
}

static void svg_span(void *user, const tn_trace_thread *th, const tn_prof_span *s) {
    svg_ctx *C = user;
    (void)th;
    if (s->depth > C->max_depth) C->max_depth = s->depth;
    if (s->depth != C->depth || s->t1 <= C->t0 || s->t0 >= C->t1) return;
    const int kind = s->b->kind;
    const double x0 = svg_x(C, s->t0), x1 = svg_x(C, s->t1), w = x1 - x0 < 0.3 ? 0.3 : x1 - x0;
    if (kind == TN_TK_LAYER) { /* a band above the ops, alternating shades, labelled when wide */
        fprintf(C->f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"5\" fill=\"%s\"><title>layer %d: %.1f µs</title></rect>\n",
                x0, C->y, w, s->b->il % 2 ? "#555" : "#999", s->b->il, (s->t1 - s->t0) / 1e3);
        if (w > 24) fprintf(C->f, "<text x=\"%.2f\" y=\"%.1f\" font-size=\"8\" fill=\"#333\">L%d</text>\n", x0 + 1, C->y - 1, s->b->il);
        return;
    }
    const char *col = svg_colour(kind);
    if (!col) return;
    fprintf(C->f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>%s", x0, C->y + 6, w,
            SVG_ROW - 10, col, s->b->name);
    if (s->b->il >= 0) fprintf(C->f, " L%d", s->b->il);
    fprintf(C->f, " (%s) %.2f µs</title></rect>\n", tn_trace_kind_name(kind), (s->t1 - s->t0) / 1e3);
}

void tn_prof_svg_window(FILE *f, const tn_trace_thread *th, int n_th, uint64_t t0, uint64_t t1, const char *title, double y0) {
    svg_ctx C = {f, t0, t1, 0, (SVG_W - SVG_LEFT - SVG_RIGHT) / (double)(t1 > t0 ? t1 - t0 : 1), 0, 0};
    const double span_us = (t1 - t0) / 1e3;
    fprintf(f, "<g>\n<text x=\"%.0f\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\">%s — %.1f µs</text>\n", SVG_LEFT, y0 + 14,
            title, span_us);
    /* time axis: about 8 ticks at a round step */
    static const double mult[3] = {2, 2.5, 2}; /* 1, 2, 5, 10, 20, 50, ... µs */
    double step = 1;
    for (int k = 0; span_us / step > 10; k++) step *= mult[k % 3];
    const double y_rows = y0 + SVG_TOP, y_end = y_rows + SVG_ROW * n_th;
    for (double u = 0; u <= span_us + 1e-9; u += step) {
        const double x = SVG_LEFT + u * 1e3 * C.scale;
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x, y_rows - 4, x, y_end);
        fprintf(f, "<text x=\"%.2f\" y=\"%.1f\" font-size=\"9\" text-anchor=\"middle\" fill=\"#555\">%g µs</text>\n", x, y_rows - 8, u);
    }
    for (int i = 0; i < n_th; i++) {
        C.y = y_rows + SVG_ROW * i;
        fprintf(f, "<text x=\"4\" y=\"%.1f\">%s</text>\n", C.y + 17, th[i].name);
        C.max_depth = 0;
        for (C.depth = 0; C.depth <= C.max_depth && C.depth < 64; C.depth++) tn_prof_walk(&th[i], svg_span, &C);
    }
    /* legend */
    static const int kinds[] = {TN_TK_EMBED, TN_TK_NORM, TN_TK_QUANT, TN_TK_MATMUL, TN_TK_ROPE, TN_TK_ATTENTION, TN_TK_OUTPUT,
                                TN_TK_SAMPLE, TN_TK_BARRIER};
    double x = SVG_LEFT;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">%s</text>\n", x,
                y_end + 8, svg_colour(kinds[k]), x + 13, y_end + 17, kinds[k] == TN_TK_BARRIER ? "barrier wait" : tn_trace_kind_name(kinds[k]));
        x += 20 + 7.0 * (double)strlen(tn_trace_kind_name(kinds[k])) + (kinds[k] == TN_TK_BARRIER ? 35 : 0);
    }
    fprintf(f, "</g>\n");
}
