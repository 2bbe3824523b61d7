/**
 * TLS as the client on a stream we already hold (a socket from the Dialer, direct or through a CONNECT proxy):
 * the one place that wraps it and waits for the handshake, for every client that dials then speaks TLS (the
 * agent's tunnel, gwsh's resource routes, the Kubernetes API dial, HTTPS through the Dialer).
 *
 * SNI: `servername` when given, else the host unless the host is an IP address (SNI carries names only).
 * Resolves on 'secureConnect'; rejects with the socket's first error as it came, for the caller to classify
 * (src/dial/tlsverify.ts) and name. The error listener stays on after the handshake, as it always has.
 *
 * A certificate that fails the check is refused exactly as Node refuses it (the same error object, the socket
 * destroyed before anything is written), but first the chain the server presented is read and kept with the error
 * (handshakeFailure below): who issued a refused certificate is what tells a TLS-inspecting proxy from a wrong
 * server, and Node's own refusal destroys the socket before the chain can be read. So the check is asked of Node
 * with rejectUnauthorized off and enforced here: only a socket Node calls authorized is ever handed back.
 *
 * The handshake has a deadline (handshakeTimeoutMs, 30 s unless given): a server, or a proxy in the path, that
 * takes the connection and never finishes the handshake is GW_ERR_TLS_HANDSHAKE_TIMEOUT, not a wait for ever.
 */
import { X509Certificate } from 'node:crypto';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import tls, { type DetailedPeerCertificate } from 'node:tls';
import { GatewayError } from '../errors.js';
import { tlsVerifyResult } from '../internals.js';

export const TLS_HANDSHAKE_TIMEOUT_MS = 30_000;

/** One certificate of the chain a server presented. */
export interface PresentedCert {
  /** Distinguished names as "CN=..., O=..." in the certificate's order. */
  subject: string;
  issuer: string;
  /** Subject and issuer are the same name: a root, or a self-signed leaf. */
  selfIssued: boolean;
  fingerprint256: string;
  raw: Buffer;
}

/** What a refused handshake leaves behind: the chain presented (leaf first) and the stream it ran over. */
export interface HandshakeFailure {
  chain: PresentedCert[];
  stream: Duplex;
}

const failures = new WeakMap<object, HandshakeFailure>();

/** The chain and stream of a certificate refusal made by connectTls, when err is one. */
export function handshakeFailure(err: unknown): HandshakeFailure | undefined {
  return typeof err === 'object' && err !== null ? failures.get(err) : undefined;
}

/** At most this many certificates of a presented chain are kept. */
const MAX_CHAIN = 10;

function dn(text: string): string {
  return text.split('\n').filter((l) => l !== '').join(', ');
}

/** The chain as presented, leaf first, from Node's linked certificates (a self-signed one links to itself). */
export function presentedChain(leaf: DetailedPeerCertificate | undefined): PresentedCert[] {
  const out: PresentedCert[] = [];
  const seen = new Set<string>();
  for (let c = leaf; c?.raw && out.length < MAX_CHAIN && !seen.has(c.fingerprint256); c = c.issuerCertificate) {
    seen.add(c.fingerprint256);
    try {
      const x = new X509Certificate(c.raw);
      out.push({ subject: dn(x.subject), issuer: dn(x.issuer), selfIssued: x.subject === x.issuer, fingerprint256: c.fingerprint256, raw: c.raw });
    } catch {
      break;
    }
  }
  return out;
}

/** The refusal for a socket Node did not authorize: the check's own error object where one can be had. */
function refusal(socket: tls.TLSSocket, identityError: Error | undefined): Error {
  if (identityError) return identityError;
  const verdict = tlsVerifyResult(socket)?.error;
  if (verdict) return verdict;
  const code = typeof socket.authorizationError === 'string' ? socket.authorizationError : String(socket.authorizationError ?? 'UNKNOWN');
  return Object.assign(new Error(`the server's certificate was not verified (${code})`), { code });
}

export function connectTls(
  stream: Duplex,
  options: Omit<tls.ConnectionOptions, 'socket'> & { host: string; handshakeTimeoutMs?: number },
): Promise<tls.TLSSocket> {
  const servername = options.servername ?? (net.isIP(options.host) ? undefined : options.host);
  const { servername: _given, rejectUnauthorized, checkServerIdentity, handshakeTimeoutMs = TLS_HANDSHAKE_TIMEOUT_MS, ...rest } = options;
  const enforce = rejectUnauthorized !== false;
  let identityError: Error | undefined;
  const check = checkServerIdentity ?? tls.checkServerIdentity;
  const socket = tls.connect({
    ...rest,
    socket: stream,
    ...(servername ? { servername } : {}),
    rejectUnauthorized: false,
    checkServerIdentity: (host, cert) => {
      const err = check(host, cert);
      if (err) identityError = err;
      return err;
    },
  });
  return new Promise<tls.TLSSocket>((resolve, reject) => {
    const timer = setTimeout(() => {
      const where = `${options.host}${options.port === undefined ? '' : `:${options.port}`}`;
      reject(
        new GatewayError('GW_ERR_TLS_HANDSHAKE_TIMEOUT', `the TLS handshake with ${servername ?? where} did not complete within ${handshakeTimeoutMs} ms`, {
          details: { host: options.host, timeout_ms: handshakeTimeoutMs },
        }),
      );
      socket.destroy();
      stream.destroy();
    }, handshakeTimeoutMs);
    socket.once('secureConnect', () => {
      clearTimeout(timer);
      if (!enforce || socket.authorized) return resolve(socket);
      const err = refusal(socket, identityError);
      if (typeof err === 'object') failures.set(err, { chain: presentedChain(socket.getPeerCertificate(true)), stream });
      socket.destroy();
      reject(err);
    });
    socket.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}
