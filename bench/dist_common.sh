# bench/dist_common.sh — sourced by bench/dist_converge.sh and bench/dist_link.sh: the setup they
# share. Needs here (the checkout), tern, work, LINES and CTX set. Makes the corpus (the first LINES
# lines of the default model's King James Bible text, scripts/make-kjv-corpus.sh) and a 1024-token
# BPE learned on it in work/ (kept between runs), and sets MODEL: the default model's family at a
# small size (llama: n_embd 128, 2 layers, 4/2 heads, n_ff 384; 656,000 parameters).
command -v mpirun >/dev/null || { echo "needs mpirun (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 66; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$work"
[ -s "$work/kjv.txt" ] || "$here/scripts/make-kjv-corpus.sh" "$work/kjv.txt"
head -n "$LINES" "$work/kjv.txt" > "$work/corpus.txt"
[ -s "$work/tok.gguf" ] || "$tern" tokenizer-train --vocab 1024 -o "$work/tok.gguf" "$work/corpus.txt" 2>"$work/tok.log"
MODEL=(--data "$work/corpus.txt" --tokenizer "$work/tok.gguf" --n-embd 128 --n-layer 2 --n-head 4 --n-head-kv 2
       --n-ff 384 --ctx "$CTX")
