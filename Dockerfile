# syntax=docker/dockerfile:1
#
# The tessera image: one `tessera` daemon per container, as a Kubeflow TFJob replica or a pod
# of the plain StatefulSets (deploy/README.md).
#
#   docker build -t tessera:0.1.0 .
#   docker run --rm tessera:0.1.0                    # `tessera local`: the embedded 3-task cluster
#   docker run --rm tessera:0.1.0 train --help
#
# The build needs only a Rust toolchain: build.rs compiles proto/ with protox (no protoc), and
# GPUs are found at run time (no CUDA toolkit). The cache mounts keep the crates.io downloads
# and the compiled dependencies between builds, so a change to tessera's own sources rebuilds
# tessera alone (BuildKit, the default builder since Docker 23).

# The toolchain CI and the developers use; Cargo.toml's rust-version (1.85) is the oldest that
# builds. Builder and runtime are both Debian 12 (bookworm): the binary links the glibc it was
# built against.
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin tessera \
    && install -m 0755 target/release/tessera /usr/local/bin/tessera

FROM debian:bookworm-slim
# The binary needs only glibc, libm and libgcc_s, which the base image has. OpenBLAS is loaded
# at run time for the large matrix products (without it they go through the gemm crate, about
# 20 % slower). tessera's own TLS trusts only the CA that `[tls] ca` names; the system roots are
# for anything else the image runs.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libopenblas0 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 65532 tessera \
    && useradd --system --uid 65532 --gid 65532 --no-create-home \
       --home-dir /var/lib/tessera --shell /usr/sbin/nologin tessera \
    && install -d -o 65532 -g 65532 -m 0750 /var/lib/tessera
COPY --from=builder /usr/local/bin/tessera /usr/local/bin/tessera
# The working directory takes the chief's default `runs/` event files and `tessera local`'s;
# the manifests mount the shared checkpoint volume here.
WORKDIR /var/lib/tessera
USER 65532:65532
# 2222: the task's gRPC port (MasterService, WorkerService, grpc.health.v1 and the tensor
# channel); 9100: Prometheus metrics where `[metrics] listen` (TESSERA__METRICS__LISTEN) enables
# them.
EXPOSE 2222 9100
# SIGTERM drains in-flight calls (`timeouts.shutdown_grace`, 5 s by default) and exits.
STOPSIGNAL SIGTERM
ENTRYPOINT ["tessera"]
CMD ["local"]
