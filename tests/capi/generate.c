/* A C program built against the installed tessera (tests/capi/install_test.sh): generates for a raw
 * prompt and prints the answer's token ids on one line, then its text, as `tessera generate --raw`. */
#include <stdio.h>
#include <stdlib.h>
#include <tessera/tessera.h>

static int32_t on_step(const tessera_step_event* ev, void* user) {
  (void)ev;
  ++*(int*)user;
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s MODEL PROMPT GEN_LENGTH STEPS\n", argv[0]);
    return 2;
  }
  tessera_model* model = NULL;
  if (tessera_model_open(argv[1], NULL, &model) != TESSERA_OK) {
    fprintf(stderr, "error: %s\n", tessera_last_error());
    return 1;
  }
  tessera_chat_message msg = {"user", argv[2]};
  int32_t prompt[512];
  size_t n_prompt = 0;
  tessera_generate_options o;
  tessera_result* r = NULL;
  int steps_seen = 0;
  if (tessera_prompt_tokens(model, &msg, 1, 0, prompt, 512, &n_prompt) != TESSERA_OK ||
      tessera_generate_options_init(model, &o) != TESSERA_OK) {
    fprintf(stderr, "error: %s\n", tessera_last_error());
    return 1;
  }
  o.gen_length = atoi(argv[3]);
  o.steps = atoi(argv[4]);
  if (tessera_generate(model, prompt, n_prompt, &o, on_step, &steps_seen, &r) != TESSERA_OK) {
    fprintf(stderr, "error: %s\n", tessera_last_error());
    return 1;
  }
  const int32_t* ids = NULL;
  size_t n = tessera_result_tokens(r, &ids);
  for (size_t i = 0; i < n; ++i) printf(i ? " %d" : "%d", ids[i]);
  printf("\n%s\n", tessera_result_text(r));
  tessera_result_stats st;
  st.struct_size = sizeof st;
  tessera_result_stats_get(r, &st);
  fprintf(stderr, "tessera %s: %d steps (%d callbacks), %.3f s\n", tessera_version(), st.steps, steps_seen,
          st.seconds);
  tessera_result_free(r);
  tessera_model_close(model);
  return st.steps == steps_seen ? 0 : 1;
}
