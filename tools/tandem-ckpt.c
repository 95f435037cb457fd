/* tandem-ckpt: inspect, check and convert Tandem checkpoints (format 2).
 *
 *   tandem-ckpt info DIR              what the checkpoint holds, after verifying every byte
 *   tandem-ckpt verify DIR            every file's size and every chunk's CRC-32
 *   tandem-ckpt consolidate DIR OUT   all parameters, fp32, into one safetensors file
 *
 * DIR is a checkpoint root (its `latest` is followed) or one step-N
 * directory. A checkpoint saved at any world size and ZeRO stage is read the
 * same way: the manifest maps element ranges of each arena to pieces of the
 * data files (src/train/checkpoint/ckpt.h).
 *
 * Output goes to stdout; errors to stderr, naming the file and the problem.
 * Exit status: 0 good, 1 the checkpoint is missing, corrupt or unreadable
 * (or OUT cannot be written), 2 usage. */
#include "base/base.h"
#include "train/checkpoint/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(void) {
  fprintf(stderr,
          "usage: tandem-ckpt info DIR\n"
          "       tandem-ckpt verify DIR\n"
          "       tandem-ckpt consolidate DIR OUT.safetensors\n"
          "DIR: a checkpoint directory (the --save directory, whose 'latest' is followed, or one step-N in it).\n");
  return 2;
}

static int fail(const char *what) {
  fprintf(stderr, "tandem-ckpt %s: %s\n", what, td_last_error());
  return 1;
}

static void human(uint64_t bytes, char *out, size_t size) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  snprintf(out, size, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

static void print_info(const td_ckpt_dir *d, uint64_t verified) {
  const td_ckpt_manifest *m = &d->m;
  char h[32];
  printf("checkpoint   %s\n", d->dir);
  printf("format       %d\n", m->format);
  printf("step         %ld\n", m->step);
  printf("saved by     %d rank%s at ZeRO stage %d (loads at any world size and stage)\n", m->world,
         m->world == 1 ? "" : "s", m->zero_stage);
  printf("sampler      %llu samples consumed (global batch %llu, seed %llu, dataset of %llu samples)\n", m->consumed,
         m->train_batch_size, m->seed, m->dataset_samples);
  printf("model        %s%s%s: %zu parameters in %d tensors\n", m->kind, m->model_config[0] ? " " : "",
         m->model_config, m->n_params, m->n_tensors);
  printf("optimizer    %s\n", m->optimizer);
  printf("arenas       ");
  for (int a = 0; a < m->n_arenas; a++) {
    human(m->arenas[a].count * 4, h, sizeof h);
    printf("%s%s f32 x %llu (%s)", a ? ", " : "", m->arenas[a].name, (unsigned long long)m->arenas[a].count, h);
  }
  printf("\n");
  uint64_t total = 0;
  for (int f = 0; f < m->n_files; f++) total += m->files[f].bytes;
  human(total, h, sizeof h);
  printf("files        %d data files, %s, %d pieces, CRC-32 per %llu bytes\n", m->n_files, h, m->n_pieces,
         (unsigned long long)m->chunk_bytes);
  for (int f = 0; f < m->n_files; f++) {
    human(m->files[f].bytes, h, sizeof h);
    printf("  %-14s %10s ", m->files[f].name, h);
    for (int i = 0; i < m->n_pieces; i++)
      if (m->pieces[i].file == f)
        printf(" %s[%llu,%llu)", m->arenas[m->pieces[i].arena].name, (unsigned long long)m->pieces[i].lo,
               (unsigned long long)m->pieces[i].hi);
    printf("\n");
  }
  human(verified, h, sizeof h);
  printf("verified     %s read, every size and CRC-32 matches the manifest\n", h);
}

int main(int argc, char **argv) {
  if (argc < 3) return usage();
  const char *cmd = argv[1], *path = argv[2];
  int is_info = strcmp(cmd, "info") == 0, is_verify = strcmp(cmd, "verify") == 0;
  int is_consolidate = strcmp(cmd, "consolidate") == 0;
  if (!(is_info || is_verify || is_consolidate) || (is_consolidate ? argc != 4 : argc != 3)) return usage();
  td_ckpt_dir d;
  if (td_ckpt_open(path, &d) != TD_OK) return fail(cmd);
  int rc = 0;
  if (is_info || is_verify) {
    uint64_t bytes = 0;
    double t0 = td_now();
    if (td_ckpt_verify(&d, &bytes) != TD_OK) {
      rc = fail(cmd);
    } else if (is_info) {
      print_info(&d, bytes);
    } else {
      double s = td_now() - t0;
      char h[32];
      human(bytes, h, sizeof h);
      printf("ok: %s (step %ld): %d files, %d pieces, %s verified in %.2f s\n", d.dir, d.m.step, d.m.n_files,
             d.m.n_pieces, h, s);
    }
  } else {
    if (td_ckpt_consolidate(&d, argv[3]) != TD_OK) {
      rc = fail(cmd);
    } else {
      char h[32];
      human((uint64_t)d.m.n_params * 4, h, sizeof h);
      printf("wrote %s: %d tensors, %zu fp32 parameters (%s) of step %ld\n", argv[3],
             d.m.n_tensors > 0 ? d.m.n_tensors : 1, d.m.n_params, h, d.m.step);
    }
  }
  td_ckpt_close(&d);
  return rc;
}
