# Multi-stage build of the sluice binary.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends curl ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/sluice /usr/local/bin/sluice
USER nobody
EXPOSE 8080
ENTRYPOINT ["sluice"]
CMD ["serve", "--listen", "0.0.0.0:8080"]
