/**
 * How the Proxy's web port answers (the Web UI's routes in web.ts, the apps in webapps.ts, ping and find in
 * frontdoor.ts): JSON that is never cached or sniffed, an error with its code's HTTP status (src/errors.ts), and a
 * response cut as a break once its head was sent.
 */
import type http from 'node:http';
import type { Duplex } from 'node:stream';
import { httpStatus, toGatewayError } from '../errors.js';
import { resetStream } from '../stream/reset.js';
import { kubeStatus } from '../wire/kubeimpersonate.js';

/** A JSON answer of the web port (the Web UI's routes, ping, find, errors): never cached, never sniffed. */
export function sendJson(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store', 'x-content-type-options': 'nosniff', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

export function sendWebError(res: http.ServerResponse, err: unknown): void {
  const e = toGatewayError(err);
  if (res.headersSent) return abortResponse(res);
  sendJson(res, httpStatus(e.code), { error: e.toJSON() });
}

/**
 * The Proxy's own refusal on the Kubernetes route, as a Kubernetes Status (src/wire/kubeimpersonate.ts kubeStatus,
 * which the agent answers an end-to-end kube stream's refusals with too).
 */
export function sendKubeError(res: http.ServerResponse, err: unknown): void {
  const e = toGatewayError(err);
  if (res.headersSent) return abortResponse(res);
  sendJson(res, httpStatus(e.code), kubeStatus(e));
}

/**
 * Cuts a response whose head was sent, as a break and never as an end (docs/security.md, "A broken stream is
 * reset, never ended"): over HTTP/2 its stream gets RST_STREAM, over HTTP/1.1 its connection an RST (both by
 * src/stream/reset.ts), so a chunked body never gets its last chunk and a content-length body stays short with
 * an error at the client.
 */
export function abortResponse(res: http.ServerResponse): void {
  if (res.writableFinished) return;
  const stream = (res as unknown as { stream?: Duplex }).stream ?? res.socket;
  if (stream) resetStream(stream);
  else res.destroy();
}

/** An HTTP/1.1 answer on a socket that was to be upgraded (nothing was upgraded): the error (on the kube route a Kubernetes Status), then the close. */
export function refuseUpgrade(socket: Duplex, err: unknown, kube = false): void {
  const e = toGatewayError(err);
  const body = JSON.stringify(kube ? kubeStatus(e) : { error: e.toJSON() });
  const status = httpStatus(e.code);
  if (!socket.destroyed) socket.end(`HTTP/1.1 ${status} Refused\r\ncontent-type: application/json\r\ncache-control: no-store\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
}
