// distribute-mpi-bench: the same sweep as distribute-bench, run with OpenMPI's
// own collectives (MPI_Allreduce, MPI_Allgather, MPI_Bcast, MPI_Reduce_scatter_block) between processes
// on this host, so bench/compare_mpi.sh can print the two side by side.
// Rank 0 times each operation after a barrier; rows give the median and min.
//
//   mpirun -np 2 distribute-mpi-bench --op all_reduce -b 8 -e 64M -f 4 --csv mpi.csv
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

std::size_t parse_size(const char* text) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  double mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1024;
  if (*end == 'M' || *end == 'm') mult = 1024.0 * 1024;
  if (*end == 'G' || *end == 'g') mult = 1024.0 * 1024 * 1024;
  return static_cast<std::size_t>(v * mult);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string op = "all_reduce", csv;
  std::size_t min_bytes = 8, max_bytes = 64 << 20;
  double factor = 4;
  int iters = 20, warmup = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--op")
      op = argv[i + 1];
    else if (a == "-b")
      min_bytes = parse_size(argv[i + 1]);
    else if (a == "-e")
      max_bytes = parse_size(argv[i + 1]);
    else if (a == "-f")
      factor = std::atof(argv[i + 1]);
    else if (a == "--iters")
      iters = std::atoi(argv[i + 1]);
    else if (a == "--warmup")
      warmup = std::atoi(argv[i + 1]);
    else if (a == "--csv")
      csv = argv[i + 1];
    else {
      if (rank == 0) std::fprintf(stderr, "distribute-mpi-bench: unknown flag %s\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (op != "all_reduce" && op != "all_gather" && op != "broadcast" && op != "reduce_scatter") {
    if (rank == 0) std::fprintf(stderr, "distribute-mpi-bench: unknown --op %s\n", op.c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  std::ofstream out;
  if (rank == 0 && !csv.empty()) {
    out.open(csv);
    out << "op,ranks,bytes,count,median_us,min_us,algbw_gbs,busbw_gbs\n";
  }
  if (rank == 0) {
    std::printf("# distribute-mpi-bench: %s float32 (MPI_SUM), %d ranks\n", op.c_str(), size);
    std::printf("# %12s %11s %11s %10s %11s %11s\n", "size(B)", "count", "median(us)", "min(us)", "algbw(GB/s)",
                "busbw(GB/s)");
  }
  for (std::size_t bytes = min_bytes; bytes <= max_bytes;
       bytes = std::max(bytes + 1, static_cast<std::size_t>(static_cast<double>(bytes) * factor))) {
    std::size_t count = std::max<std::size_t>(1, bytes / sizeof(float));
    const bool blocks = op == "all_gather" || op == "reduce_scatter";
    if (blocks)
      count = std::max<std::size_t>(1, count / static_cast<std::size_t>(size)) * static_cast<std::size_t>(size);
    const std::size_t block = count / static_cast<std::size_t>(size);
    const std::size_t per_rank = op == "all_gather" ? block : count;
    // (touched before timing)
    std::vector<float> send(per_rank, static_cast<float>(rank + 1)), recv(op == "reduce_scatter" ? block : count, 0.f);
    std::vector<double> times;
    for (int it = 0; it < warmup + iters; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (op == "all_reduce") {
        MPI_Allreduce(send.data(), recv.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      } else if (op == "all_gather") {
        MPI_Allgather(send.data(), static_cast<int>(per_rank), MPI_FLOAT, recv.data(), static_cast<int>(per_rank),
                      MPI_FLOAT, MPI_COMM_WORLD);
      } else if (op == "reduce_scatter") {
        MPI_Reduce_scatter_block(send.data(), recv.data(), static_cast<int>(block), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      } else {
        MPI_Bcast(recv.data(), static_cast<int>(count), MPI_FLOAT, 0, MPI_COMM_WORLD);
      }
      const double t1 = MPI_Wtime();
      if (it >= warmup) times.push_back((t1 - t0) * 1e6);
    }
    if (rank == 0) {
      std::sort(times.begin(), times.end());
      const double median = times[times.size() / 2];
      const double total = static_cast<double>(count * sizeof(float));
      const double algbw = total / (median * 1e3);
      const double busbw = algbw * (op == "all_reduce" ? 2.0 * (size - 1) / size
                                    : blocks           ? static_cast<double>(size - 1) / size
                                                       : 1.0);
      std::printf("  %12zu %11zu %11.2f %10.2f %11.3f %11.3f\n", count * sizeof(float), count, median, times.front(),
                  algbw, busbw);
      std::fflush(stdout);
      if (out) {
        out << op << ',' << size << ',' << count * sizeof(float) << ',' << count << ',' << median << ','
            << times.front() << ',' << algbw << ',' << busbw << '\n';
      }
    }
  }
  MPI_Finalize();
  return 0;
}
