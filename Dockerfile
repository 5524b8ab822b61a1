# syntax=docker/dockerfile:1

# One image with the Ordo binaries:
#   /usr/local/bin/ordo-node  the relay node (the default entrypoint)
#   /usr/local/bin/orderapi   the demo order API
#   /usr/local/bin/shipping   the example inbox consumer (docs/consumer.md)
# All are configured through ORDO_* environment variables (see -h).

FROM golang:1.26-bookworm AS build
# go.mod asks for a newer patch release than an old cached image may have;
# let the go command fetch it rather than fail.
ENV GOTOOLCHAIN=auto
# Build from the library module alone, as a user would: the workspace's
# tools module (bench/, not in the context) is not needed for the image.
ENV GOWORK=off
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ordo-node ./cmd/node && \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/orderapi ./cmd/orderapi && \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/shipping ./cmd/shipping

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ordo-node /out/orderapi /out/shipping /usr/local/bin/
USER nonroot:nonroot
# 8080: orderapi; 8081: node /healthz, /readyz, /status.
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/ordo-node"]
