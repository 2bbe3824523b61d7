/**
 * The transport that survives a TLS-inspecting proxy: a WebSocket upgrade on the Proxy's web address, inside which
 * the caller runs its usual TLS (its ALPN, its client certificate, the cluster's CA) unchanged, end to end. The
 * inspecting proxy ends the OUTER TLS with its own certificate, sees one HTTP request (GET UPGRADE_PATH with
 * Upgrade: websocket) and then only WebSocket frames of ciphertext. The Proxy hands the stream to its one-port
 * multiplexer as a new connection (src/proxy/frontdoor.ts), so the inner ClientHello is routed as on 443.
 *
 *   dial (the Dialer: the same proxy, NO_PROXY, PAC)
 *   ► outer TLS, verified against the cluster's host CA OR a root the operator gave (operatorRoots: the file in
 *     GATEWAY_PROXY_CA_FILE, NODE_EXTRA_CA_CERTS, the agent's gateway.proxy_ca_file); never unverified: the outer
 *     TLS carries no secret, but a peer nobody vouched for is not talked to
 *   ► GET UPGRADE_PATH, subprotocol UPGRADE_TRANSPORT; anything but a 101 naming it is GW_ERR_DIAL_UPGRADE_REFUSED
 *   ► a Duplex over the WebSocket (src/stream/websocket.ts: messages of at most UPGRADE_MAX_PAYLOAD each way,
 *     back-pressure both ways)
 *
 * Everything up to the 101 fits in one deadline. `ws` does the WebSocket protocol: nothing of it is written here.
 * When this transport is used is decided in one place, src/dial/fallback.ts.
 */
import { readFileSync } from 'node:fs';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { WebSocket } from 'ws';
import { formatHostPort, parseAddr } from '../addr.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { connectTls } from '../stream/tls.js';
import { webSocketDuplex } from '../stream/websocket.js';
import { UPGRADE_MAX_PAYLOAD, UPGRADE_PATH, UPGRADE_TRANSPORT } from '../wire/ping.js';
import type { Dialer } from './dialer.js';
import { tlsVerifyError } from './tlsverify.js';

/** Dial, outer TLS and the upgrade's answer, together. */
export const UPGRADE_TIMEOUT_MS = 30_000;
/** At most this many bytes of a root file are read. */
const MAX_ROOTS_FILE = 1024 * 1024;

export interface UpgradeOptions {
  /** The cluster's host CA (PEM), when this side has it: a Proxy reached without inspection presents its certificate. */
  clusterCa?: string | readonly string[];
  /** The operator's roots (PEM), for an inspecting proxy's certificate; operatorRoots() when not given. */
  roots?: readonly string[];
  /** Whole deadline up to the 101 (UPGRADE_TIMEOUT_MS unless given). */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** Where the operator's roots come from, as a hint names them. */
export const ROOTS_SETTING = 'GATEWAY_PROXY_CA_FILE (or NODE_EXTRA_CA_CERTS; for an agent, gateway.proxy_ca_file)';

const PEM_BLOCK = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/** The certificates (PEM) of a file; a file that cannot be read is a clear error naming it and where it was named. */
export function readRootsFile(path: string, from: string): string[] {
  let text: string;
  try {
    text = readFileSync(path, 'utf8').slice(0, MAX_ROOTS_FILE);
  } catch (err) {
    throw new GatewayError('GW_ERR_DIAL_UPGRADE_ROOTS', `cannot read the CA file ${path} (from ${from}): ${(err as Error).message}`, { cause: err, details: { path, from } });
  }
  const pems = text.match(PEM_BLOCK) ?? [];
  if (pems.length === 0) throw new GatewayError('GW_ERR_DIAL_UPGRADE_ROOTS', `the CA file ${path} (from ${from}) holds no PEM certificate`, { details: { path, from } });
  return pems;
}

/**
 * The roots the operator gave for TLS-inspecting proxies: GATEWAY_PROXY_CA_FILE, NODE_EXTRA_CA_CERTS (which Node
 * adds to its defaults only where no `ca` is given, so it is read here too), and the files the caller adds (an
 * agent's gateway.proxy_ca_file, given to its Dialer).
 */
export function operatorRoots(dialer: Pick<Dialer, 'environment' | 'inspectionRootFiles'>): string[] {
  const env = dialer.environment;
  const named = [
    ...(env.GATEWAY_PROXY_CA_FILE ? [{ path: env.GATEWAY_PROXY_CA_FILE, from: 'GATEWAY_PROXY_CA_FILE' }] : []),
    ...(env.NODE_EXTRA_CA_CERTS ? [{ path: env.NODE_EXTRA_CA_CERTS, from: 'NODE_EXTRA_CA_CERTS' }] : []),
    ...dialer.inspectionRootFiles,
  ];
  return named.flatMap((f) => readRootsFile(f.path, f.from));
}

function target(webAddr: string): { host: string; port: number; address: string } {
  const a = parseAddr(webAddr);
  const port = a.port ?? 443;
  return { host: a.host, port, address: formatHostPort(a.host, port) };
}

/** The outer TLS: the cluster's CA or an operator's root must vouch for the certificate, and it must hold the name. */
async function outerTls(dialer: Dialer, t: ReturnType<typeof target>, cas: string[], deadline: number, signal: AbortSignal): Promise<tls.TLSSocket> {
  const raw = await dialer.dial({ kind: 'https', host: t.host, port: t.port, text: `https://${t.address}` }, { signal });
  try {
    return await connectTls(raw, { host: t.host, port: t.port, ca: cas, ALPNProtocols: ['http/1.1'], handshakeTimeoutMs: Math.max(1, deadline - Date.now()) });
  } catch (err) {
    raw.destroy();
    throw (
      tlsVerifyError(err, {
        address: t.address,
        server: 'proxy',
        acceptsOperatorRoots: true,
        untrustedHint: `Give the root CA that signs this certificate (your organisation's, which the inspecting proxy signs with) in ${ROOTS_SETTING}; verification is never turned off.`,
      }) ?? toGatewayError(err)
    );
  }
}

/** What a server that is not a gateway Proxy (or a proxy that stripped the upgrade) answered instead of the 101. */
function refused(address: string, status: number | undefined, why: string): GatewayError {
  return new GatewayError('GW_ERR_DIAL_UPGRADE_REFUSED', `${address} did not take the connection upgrade (${UPGRADE_PATH}, ${UPGRADE_TRANSPORT}): ${why}`, {
    details: { address, ...(status === undefined ? {} : { status }) },
  });
}

/** The WebSocket upgrade on an outer TLS socket; resolves once the 101 named our subprotocol. */
function upgrade(socket: tls.TLSSocket, t: ReturnType<typeof target>, deadline: number, signal: AbortSignal): Promise<WebSocket> {
  const ws = new WebSocket(`wss://${t.address}${UPGRADE_PATH}`, [UPGRADE_TRANSPORT], {
    createConnection: () => socket,
    maxPayload: UPGRADE_MAX_PAYLOAD,
    perMessageDeflate: false,
    followRedirects: false,
    handshakeTimeout: Math.max(1, deadline - Date.now()),
  });
  return new Promise<WebSocket>((resolve, reject) => {
    const fail = (e: GatewayError) => {
      signal.removeEventListener('abort', onAbort);
      ws.terminate();
      socket.destroy();
      reject(e);
    };
    const onAbort = () => fail(new GatewayError('GW_ERR_DIAL_UPGRADE_TIMEOUT', `the connection upgrade at ${t.address} did not complete within its deadline`, { details: { address: t.address } }));
    signal.addEventListener('abort', onAbort, { once: true });
    ws.once('unexpected-response', (_req, res) => {
      res.resume();
      fail(refused(t.address, res.statusCode, `it answered ${res.statusCode ?? '?'} instead of 101 Switching Protocols`));
    });
    ws.once('error', (err) => {
      const timeout = /timed out/i.test(err.message);
      fail(timeout ? new GatewayError('GW_ERR_DIAL_UPGRADE_TIMEOUT', `the connection upgrade at ${t.address} did not complete: ${err.message}`, { cause: err }) : refused(t.address, undefined, err.message));
    });
    ws.once('open', () => {
      signal.removeEventListener('abort', onAbort);
      if (ws.protocol !== UPGRADE_TRANSPORT) return fail(refused(t.address, 101, `it switched to ${JSON.stringify(ws.protocol)}, not ${UPGRADE_TRANSPORT}`));
      resolve(ws);
    });
  });
}

/**
 * A stream to the Proxy's one-port router through a WebSocket upgrade on its web address: the caller runs its own
 * TLS on it as it would on a socket to the one port. A rung of the agent's transport ladder.
 */
export async function openUpgradeStream(dialer: Dialer, webAddr: string, opts: UpgradeOptions = {}): Promise<Duplex> {
  const t = target(webAddr);
  const timeoutMs = opts.timeoutMs ?? UPGRADE_TIMEOUT_MS;
  const deadline = Date.now() + timeoutMs;
  const signal = opts.signal ? AbortSignal.any([opts.signal, AbortSignal.timeout(timeoutMs)]) : AbortSignal.timeout(timeoutMs);
  const cas = [...(opts.clusterCa === undefined ? [] : ([] as string[]).concat(opts.clusterCa)), ...(opts.roots ?? operatorRoots(dialer))];
  if (cas.length === 0) {
    throw new GatewayError('GW_ERR_DIAL_UPGRADE_ROOTS', `no CA to verify ${t.address} with for the connection upgrade`, { hint: `Give the root CA the inspecting proxy signs with in ${ROOTS_SETTING}.` });
  }
  let socket: tls.TLSSocket;
  try {
    socket = await outerTls(dialer, t, cas, deadline, signal);
  } catch (err) {
    const e = toGatewayError(err);
    if (e.code === 'GW_ERR_DIAL_ABORTED' && !opts.signal?.aborted) throw new GatewayError('GW_ERR_DIAL_UPGRADE_TIMEOUT', `the connection upgrade at ${t.address} could not dial it within ${timeoutMs} ms`, { cause: e });
    throw e;
  }
  const ws = await upgrade(socket, t, deadline, signal);
  const stream = webSocketDuplex(ws, UPGRADE_MAX_PAYLOAD);
  stream.on('error', () => stream.destroy());
  return stream;
}
