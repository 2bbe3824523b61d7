/**
 * Streaming HTTPS downloads through the Dialer (HTTPS_PROXY / NO_PROXY apply), for release tarballs: the body
 * goes to a file while its SHA-256 is computed, with a progress callback. Redirects (CDNs use them) are followed
 * up to 5 times, never from https:// to http://.
 *
 * The server is checked for chain and name against the same CAs as the version server (the agent's host CA among
 * them). A certificate of the cluster's CA is accepted only when it is a Proxy's (the role proxy, as the version
 * server's check: a Proxy relays releases at /v1/webapi/autoupdate/artifacts); any other member's is refused, since an
 * agent may hold a certificate under the download location's name (releaseServerIdentity, every hop of a redirect).
 */
import { createHash } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import { proxyOrOutsideServerIdentity } from '../client/api.js';
import { DialerAgent } from '../dial/agent.js';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { trustedCas } from './client.js';

export interface DownloadOptions {
  dialer: Dialer;
  ca?: string[];
  /** The most bytes a download may have: a larger Content-Length is refused before the body, a longer body is cut. */
  maxBytes?: number;
  /** Idle deadline: no byte for this long fails the download. */
  idleTimeoutMs?: number;
  /** Called with (bytes so far, total from content-length or undefined). */
  onProgress?: (bytes: number, total: number | undefined) => void;
  onStart?: (total: number | undefined) => void;
}

/**
 * The download location's certificate check: chain and name; a certificate of the cluster's CA only when it is a
 * Proxy's (the Proxy's artifact route), never another member's.
 */
export const releaseServerIdentity = proxyOrOutsideServerIdentity('the release download server (a Proxy relays releases; no other member of the cluster does)');

/** A release tarball is well under this (the runtime, the app and its modules, compressed). */
export const DEFAULT_MAX_DOWNLOAD_BYTES = 2 * 1024 ** 3;

export interface Downloaded {
  bytes: number;
  sha256: string;
}

/** Node's HTTP parser errors (HPE_*), said plainly: a server that sends more than its Content-Length, or garbage. */
function reason(err: unknown): string {
  const code = (err as { code?: unknown } | null)?.code;
  const message = toGatewayError(err).message;
  return typeof code === 'string' && code.startsWith('HPE_') ? `the answer is not valid HTTP (${message}: bytes past its Content-Length, or garbage)` : message;
}

function fail(url: string, why: string, cause?: unknown): GatewayError {
  return new GatewayError('GW_ERR_UPGRADE_DOWNLOAD', `cannot download ${url}: ${why}`, { ...(cause === undefined ? {} : { cause }), details: { url } });
}

function request(url: URL, options: DownloadOptions, agent: DialerAgent): Promise<http.IncomingMessage> {
  const ca = trustedCas(options.ca);
  return new Promise((resolve, reject) => {
    const req = (url.protocol === 'http:' ? http : https).request(
      {
        protocol: url.protocol,
        hostname: url.hostname,
        port: url.port || undefined,
        path: `${url.pathname}${url.search}`,
        method: 'GET',
        agent,
        headers: { 'user-agent': 'gateway-upgrade' },
        timeout: options.idleTimeoutMs ?? 30_000,
        ...(ca ? { ca } : {}),
        checkServerIdentity: releaseServerIdentity,
      },
      resolve,
    );
    req.on('timeout', () => req.destroy(fail(url.href, `no data for ${Math.round((options.idleTimeoutMs ?? 30_000) / 1000)} s`)));
    req.on('error', (err) => reject(err instanceof GatewayError ? err : fail(url.href, reason(err), err)));
    req.end();
  });
}

/** Downloads url into dest (created or truncated). Throws GW_ERR_UPGRADE_DOWNLOAD, or GW_ERR_TLS_WRONG_ROLE (a member's certificate). */
export async function download(url: string, dest: string, options: DownloadOptions): Promise<Downloaded> {
  const agent = new DialerAgent(options.dialer);
  try {
    let current = new URL(url);
    for (let hop = 0; ; hop++) {
      let res: http.IncomingMessage;
      try {
        res = await request(current, options, agent);
      } catch (err) {
        // A cluster member's certificate (releaseServerIdentity) keeps its own code and hint.
        const own = err instanceof GatewayError && (err.code === 'GW_ERR_UPGRADE_DOWNLOAD' || err.code === 'GW_ERR_TLS_WRONG_ROLE');
        throw own ? err : fail(current.href, reason(err), err);
      }
      const status = res.statusCode ?? 0;
      if (status >= 300 && status < 400 && res.headers.location) {
        res.resume();
        if (hop >= 5) throw fail(url, 'too many redirects');
        const next = new URL(res.headers.location, current);
        if (current.protocol === 'https:' && next.protocol !== 'https:') throw fail(url, `redirected to ${next.protocol}// ${next.host}, which is not https`);
        current = next;
        continue;
      }
      if (status !== 200) {
        res.resume();
        throw fail(current.href, `HTTP ${status}`);
      }
      const length = Number(res.headers['content-length']);
      const total = Number.isFinite(length) && length > 0 ? length : undefined;
      const max = options.maxBytes ?? DEFAULT_MAX_DOWNLOAD_BYTES;
      if (total !== undefined && total > max) {
        res.destroy();
        throw fail(current.href, `it announces ${total} bytes, more than the ${max} a release may have`);
      }
      options.onStart?.(total);
      const hash = createHash('sha256');
      let bytes = 0;
      const out = createWriteStream(dest);
      await new Promise<void>((resolve, reject) => {
        let settled = false;
        const onError = (err: unknown) => {
          if (settled) return; // destroying below may report the cut it causes: the first reason is the one
          settled = true;
          reject(err instanceof GatewayError ? err : fail(current.href, reason(err), err));
          res.destroy();
          out.destroy();
        };
        res.on('data', (chunk: Buffer) => {
          hash.update(chunk);
          bytes += chunk.length;
          if (bytes > max) return onError(fail(current.href, `it sends more than the ${max} bytes a release may have`));
          options.onProgress?.(bytes, total);
          if (!out.write(chunk)) {
            res.pause();
            out.once('drain', () => res.resume());
          }
        });
        let ended = false;
        res.on('aborted', () => onError(fail(current.href, `the connection closed after ${bytes} bytes, before the end (truncated)`)));
        res.on('close', () => ended || onError(fail(current.href, `the connection closed after ${bytes} bytes, before the end (truncated)`)));
        res.on('error', onError);
        out.on('error', onError);
        res.on('end', () => {
          ended = true;
          if (total !== undefined && bytes !== total) return onError(fail(current.href, `got ${bytes} of ${total} bytes (truncated)`));
          out.end(() => resolve());
        });
      });
      return { bytes, sha256: hash.digest('hex') };
    }
  } finally {
    agent.destroy();
  }
}
