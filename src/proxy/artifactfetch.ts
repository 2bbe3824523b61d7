/**
 * One upstream fetch of an artifact, shared by every request for that file while it runs: the body goes to a
 * temporary file of the cache (written in order, each chunk before the next is read, so the upstream is read no faster
 * than the disk takes it), and readers follow the file up to what has been written (a reader that catches up waits for
 * the next chunk). Readers never hold the upstream back: a slow client only falls behind in the file.
 *
 * The upstream is asked through the Proxy's Dialer (so through its HTTPS_PROXY / NO_PROXY, the corporate proxy on its
 * side), with redirects followed up to 5 times and never from https:// to http://. One deadline, fetchTimeoutMs, holds
 * for the answer's headers and then for each next byte (the socket's idle timeout), and deadlineMs for the whole
 * fetch (an upstream that trickles a byte now and then). The body is capped
 * (a Content-Length over the cap is refused before the body, a longer body is cut); a body that ends short of its
 * Content-Length, or a connection that closes before the end, fails the fetch: its readers' connections are cut (so a
 * client's own checksum or length check fails) and nothing is committed to the cache.
 */
import { open, rm, type FileHandle } from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import tls from 'node:tls';
import { DialerAgent } from '../dial/agent.js';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError, toGatewayError, type ErrorCode } from '../errors.js';
import { artifactMetrics } from '../metrics/artifacts.js';

/** A release tarball is well under 2 GiB; a package or an index far smaller. */
export const MAX_ARTIFACT_BYTES = 4 * 1024 ** 3;

const TIMEOUT_CODES: ReadonlySet<ErrorCode> = new Set<ErrorCode>(['GW_ERR_HTTP_TIMEOUT', 'GW_ERR_DIAL_CONNECT_TIMEOUT', 'GW_ERR_DIAL_PROXY_NO_ANSWER']);

export interface FetchSpec {
  dialer: Dialer;
  /** The upstream URL (no user information: the configuration refuses it, so it may be logged and shown). */
  url: string;
  tmpPath: string;
  fetchTimeoutMs: number;
  /** The longest the whole fetch may take (an upstream that trickles a byte now and then stays under fetchTimeoutMs). */
  deadlineMs: number;
  maxBytes?: number;
  /** Extra CAs (PEM) for https upstreams besides the system's (tests). */
  ca?: string[];
}

export type FetchState = 'headers' | 'body' | 'done' | 'failed';

export class ArtifactFetch {
  state: FetchState = 'headers';
  written = 0;
  length: number | undefined;
  type = 'application/octet-stream';
  error: GatewayError | undefined;
  /** Resolves when the body starts (status 200), rejects with the failure before it. */
  readonly started: Promise<void>;
  /** Resolves when the fetch has settled (done or failed), after the temporary file is closed. */
  readonly settled: Promise<void>;
  private fh: FileHandle | undefined;
  private refs = 0;
  private waiters: Array<() => void> = [];
  /** The request, then the response, under way: what the overall deadline destroys. */
  private current: { destroy(err?: Error): unknown } | undefined;
  private resolveStarted!: () => void;
  private rejectStarted!: (err: GatewayError) => void;

  constructor(private readonly spec: FetchSpec) {
    this.started = new Promise((resolve, reject) => {
      this.resolveStarted = resolve;
      this.rejectStarted = reject;
    });
    this.started.catch(() => undefined);
    this.settled = this.run().catch((err: unknown) => this.fail(toGatewayError(err)));
  }

  /** Waits until more is written or the fetch settles. */
  wait(): Promise<void> {
    if (this.state === 'done' || this.state === 'failed') return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  /**
   * A hold on the temporary file, taken synchronously by whoever finds this fetch (a reader, and the relay itself
   * until it has committed the file and forgotten the fetch): the file stays open until every hold is released, so
   * nobody who found the fetch can read a closed descriptor.
   */
  hold(): void {
    this.refs++;
  }

  release(): void {
    if (--this.refs === 0) void this.fh?.close().catch(() => undefined);
  }

  /** The temporary file, once the body has started (started resolved). */
  file(): FileHandle {
    if (!this.fh) throw new GatewayError('GW_ERR_INTERNAL', 'an artifact fetch was read before its file was open');
    return this.fh;
  }

  private notify(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  private fail(err: GatewayError): void {
    if (this.state === 'done' || this.state === 'failed') return;
    this.error = err;
    const before = this.state;
    this.state = 'failed';
    if (before === 'headers') this.rejectStarted(err);
    void rm(this.spec.tmpPath, { force: true });
    this.notify();
  }

  private async run(): Promise<void> {
    try {
      this.fh = await open(this.spec.tmpPath, 'w+', 0o600);
    } catch (err) {
      throw new GatewayError('GW_ERR_ARTIFACT_CACHE', `cannot create a file in the artifact cache for ${this.shown()} (${(err as NodeJS.ErrnoException).code ?? 'error'})`, { cause: err });
    }
    const agent = new DialerAgent(this.spec.dialer);
    const deadline = setTimeout(() => this.current?.destroy(this.timeout(`not complete within ${seconds(this.spec.deadlineMs)} (the fetch's overall deadline)`)), this.spec.deadlineMs);
    try {
      const res = await this.answer(agent);
      const max = this.spec.maxBytes ?? MAX_ARTIFACT_BYTES;
      const length = Number(res.headers['content-length']);
      this.length = res.headers['content-length'] !== undefined && Number.isSafeInteger(length) && length >= 0 ? length : undefined;
      if (this.length !== undefined && this.length > max) {
        res.destroy();
        throw this.upstreamError(`it announces ${this.length} bytes, more than the ${max} an artifact may have`);
      }
      const type = res.headers['content-type'];
      if (typeof type === 'string' && /^[\w.+-]+\/[\w.+-]+(?:\s*;\s*charset=[\w-]+)?$/.test(type)) this.type = type;
      this.state = 'body';
      this.resolveStarted();
      await this.body(res, max);
      this.state = 'done';
      this.notify();
    } finally {
      clearTimeout(deadline);
      agent.destroy();
    }
  }

  /** The upstream's 200 answer, after redirects. */
  private async answer(agent: DialerAgent): Promise<http.IncomingMessage> {
    let current = new URL(this.spec.url);
    for (let hop = 0; ; hop++) {
      const res = await this.request(current, agent);
      const status = res.statusCode ?? 0;
      if (status >= 300 && status < 400 && res.headers.location) {
        res.resume();
        if (hop >= 5) throw this.upstreamError('too many redirects');
        const next = new URL(res.headers.location, current);
        if (next.protocol !== 'https:' && (current.protocol === 'https:' || next.protocol !== 'http:')) throw this.upstreamError(`redirected to ${next.protocol}//${next.host}, which it may not follow`);
        current = next;
        continue;
      }
      if (status === 200) return res;
      res.resume();
      if (status === 404 || status === 410) throw new GatewayError('GW_ERR_ARTIFACT_NOT_FOUND', `the upstream has no ${this.shown()} (HTTP ${status})`, { details: { url: this.shown(), status } });
      throw this.upstreamError(`HTTP ${status}`);
    }
  }

  private request(url: URL, agent: DialerAgent): Promise<http.IncomingMessage> {
    const ca = this.spec.ca;
    return new Promise((resolve, reject) => {
      const req = (url.protocol === 'http:' ? http : https).request(
        {
          protocol: url.protocol,
          hostname: url.hostname,
          port: url.port || undefined,
          path: url.pathname,
          method: 'GET',
          agent,
          headers: { 'user-agent': 'gateway-proxy-artifacts', accept: '*/*' },
          timeout: this.spec.fetchTimeoutMs,
          ...(ca ? { ca: [...tls.rootCertificates, ...ca] } : {}),
        },
        (res) => {
          // From here on the socket's idle timeout is the body's deadline too.
          res.socket.setTimeout(this.spec.fetchTimeoutMs, () => res.destroy(this.timeout()));
          this.current = res;
          resolve(res);
        },
      );
      this.current = req;
      req.on('timeout', () => req.destroy(this.timeout()));
      req.on('error', (err) => {
        const e = toGatewayError(err);
        if (e.code.startsWith('GW_ERR_ARTIFACT_')) return reject(e);
        reject(TIMEOUT_CODES.has(e.code) ? this.timeout() : this.upstreamError(e.message, e));
      });
      req.end();
    });
  }

  /** Writes the body to the temporary file, chunk by chunk; throws when it is cut, too long or short. */
  private body(res: http.IncomingMessage, max: number): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      let ended = false;
      let writing = Promise.resolve();
      const failWith = (err: GatewayError) => {
        res.destroy();
        reject(err);
      };
      res.on('data', (chunk: Buffer) => {
        if (this.written + chunk.length > max) return failWith(this.upstreamError(`it sends more than the ${max} bytes an artifact may have`));
        res.pause();
        artifactMetrics.upstreamBytes(chunk.length);
        writing = writing
          .then(() => this.fh!.write(chunk, 0, chunk.length, this.written))
          .then(() => {
            this.written += chunk.length;
            this.notify();
            res.resume();
          }, (err: unknown) => failWith(new GatewayError('GW_ERR_ARTIFACT_CACHE', `cannot write ${this.shown()} to the cache (${(err as NodeJS.ErrnoException).code ?? 'error'})`, { cause: err })));
      });
      res.on('end', () => {
        ended = true;
        void writing.then(() => {
          if (this.length !== undefined && this.written !== this.length) return reject(this.upstreamError(`got ${this.written} of ${this.length} bytes (truncated)`));
          resolve();
        });
      });
      res.on('error', (err) => reject(err instanceof GatewayError ? err : this.upstreamError(`the connection failed after ${this.written} bytes (${err.message})`, err)));
      res.on('close', () => ended || reject(this.upstreamError(`the connection closed after ${this.written} bytes, before the end (truncated)`)));
    });
  }

  private shown(): string {
    return this.spec.url;
  }

  private upstreamError(why: string, cause?: unknown): GatewayError {
    return new GatewayError('GW_ERR_ARTIFACT_UPSTREAM', `fetching ${this.shown()} failed: ${why}`, { details: { url: this.shown() }, ...(cause === undefined ? {} : { cause }) });
  }

  private timeout(why = `no answer or no data for ${seconds(this.spec.fetchTimeoutMs)}`): GatewayError {
    return new GatewayError('GW_ERR_ARTIFACT_UPSTREAM_TIMEOUT', `fetching ${this.shown()} failed: ${why}`, { details: { url: this.shown() } });
  }
}

function seconds(ms: number): string {
  return ms >= 1000 ? `${Math.round(ms / 1000)} s` : `${ms} ms`;
}

