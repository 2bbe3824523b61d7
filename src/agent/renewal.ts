/**
 * Host certificate renewal: an agent's host certificates (TLS and SSH, one key) live HOST_CERT_TTL_MS (a year);
 * without renewal every agent would be refused by its Proxies a year after it joined, and would need a new join
 * token. So the agent renews them by itself, for the key it joined with, well before they run out:
 *
 *   renewalPlan   pure: from the certificate's validity and the time, whether to renew now and why (the reason
 *                 is what the log prints). Due once RENEW_AT of its lifetime has passed (a year: after 8 months).
 *   HostRenewal   checks at start and every checkMs (an hour, unref'd timer); when due, asks (`ask`: over a
 *                 tunnel's control channel, the Auth API for a direct-join agent, or the Auth Service in this
 *                 process), checks what came back (same host, cluster and key; signed by the host CA it
 *                 trusts), writes cert.pem and ssh-cert.pub atomically, then updates the live identity, so
 *                 that the next dial uses the new certificates. A failed check is logged and tried again after
 *                 RENEW_RETRY (1 min doubling to checkMs, equal jitter); nothing stored changes.
 *   PendingRenewals  a tunnel's renews in flight (protocol.ts renew / renewal), each with its deadline.
 *
 * The Auth Service side: src/auth/joining.ts renewHost (docs/pki.md, "Renewal of host certificates").
 */
import { X509Certificate, createPublicKey, type KeyObject } from 'node:crypto';
import { join } from 'node:path';
import { checkHostCert, identityFromCert, parseSshCert, sshPublicKeyFromPem } from '../auth/pki.js';
import { Backoff, type BackoffDeps, type BackoffPolicy } from '../backoff.js';
import { GatewayError, isErrorCode, toGatewayError } from '../errors.js';
import { writeSecretFile } from '../fsutil.js';
import { logger } from '../log.js';
import type { RenewalMessage } from '../tunnel/protocol.js';
import type { HostIdentity } from './identity.js';

/** The share of a certificate's lifetime after which it is renewed. */
export const RENEW_AT = 2 / 3;
/** How often the agent looks at its certificate's validity (and asks again after a failed renewal). */
export const RENEW_CHECK_MS = 3600_000;
/**
 * After a failed check (docs/retries.md, "Retries"): the first retry within 30-60 s, doubling up to the check
 * interval (RENEW_CHECK_MS unless checkMs says otherwise), equal jitter; a check that does not fail resets it.
 * Most failures are a Proxy restarting under the ask: waiting a whole check interval for that was too long.
 */
export const RENEW_RETRY: BackoffPolicy = { firstMs: 60_000, maxMs: RENEW_CHECK_MS, jitter: 'equal' };
/** How long a renew over a tunnel may wait for its answer (a Proxy of an earlier version never answers). */
export const RENEW_ANSWER_MS = 60_000;

export interface RenewedCerts {
  tlsCert: string;
  sshCert: string;
}

/** Asks for fresh certificates for the public key (PEM). */
export type RenewAsk = (publicKeyPem: string) => Promise<RenewedCerts>;

export interface RenewalPlan {
  due: boolean;
  notAfter: Date;
  renewAt: Date;
  reason: string;
}

/**
 * Whether the host certificates are due for renewal at `now`, and why (pure): the TLS certificate (PEM) and, when
 * given, the SSH certificate (OpenSSH line); whichever is due first decides.
 */
export function renewalPlan(certPem: string, now: number, sshCert?: string): RenewalPlan {
  const cert = new X509Certificate(certPem);
  const tls = planOf('the certificate', Date.parse(cert.validFrom), Date.parse(cert.validTo), now);
  if (sshCert === undefined) return tls;
  const ssh = parseSshCert(sshCert.trim());
  const sshPlan = planOf('the SSH certificate', ssh.validAfter, Math.min(ssh.validBefore, 8.64e15), now);
  return sshPlan.renewAt.getTime() < tls.renewAt.getTime() ? sshPlan : tls;
}

function planOf(what: string, notBefore: number, notAfter: number, now: number): RenewalPlan {
  const renewAt = notBefore + (notAfter - notBefore) * RENEW_AT;
  const at = (ms: number) => new Date(ms).toISOString();
  const window = { notAfter: new Date(notAfter), renewAt: new Date(renewAt) };
  if (now >= notAfter) return { due: true, ...window, reason: `${what} expired at ${at(notAfter)}` };
  if (now >= renewAt) return { due: true, ...window, reason: `${what} expires at ${at(notAfter)}; renewal was due from ${at(renewAt)}` };
  return { due: false, ...window, reason: `${what} is valid until ${at(notAfter)}; renewal from ${at(renewAt)}` };
}

export interface HostRenewalOptions {
  /** The live identity: its cert, sshCert and identity fields are replaced after a renewal. */
  identity: HostIdentity;
  dataDir: string;
  ask: RenewAsk;
  /** After the identity was updated (new certificates in use from the next dial on). */
  onRenewed?: (identity: HostIdentity) => void;
  checkMs?: number;
  clock?: () => number;
  /** The checks' timers and the retry's randomness (tests drive them); default unref'd timers. */
  timers?: BackoffDeps;
}

export class HostRenewal {
  private readonly log = logger('renewal');
  private running: Promise<'renewed' | 'not-due' | 'failed'> | undefined;
  /** Times the checks: every checkMs, and after a failed one its RENEW_RETRY delay. */
  private readonly retry: Backoff;
  /** The delay the last failed check drew from the retry. */
  private retryInMs = 0;

  constructor(private readonly options: HostRenewalOptions) {
    const checkMs = options.checkMs ?? RENEW_CHECK_MS;
    this.retry = new Backoff({ ...RENEW_RETRY, firstMs: Math.min(RENEW_RETRY.firstMs, checkMs), maxMs: checkMs }, { unref: true, ...options.timers });
  }

  /** Checks now, then every checkMs (after a failed check: its retry delay). */
  start(): void {
    this.retry.resume();
    void this.tick();
  }

  stop(): void {
    this.retry.stop();
  }

  private async tick(): Promise<void> {
    const outcome = await this.check();
    this.retry.schedule(() => void this.tick(), outcome === 'failed' ? this.retryInMs : (this.options.checkMs ?? RENEW_CHECK_MS));
  }

  /** One check (and renewal when due) as of `now`; a check while one runs waits for that one. */
  check(now = (this.options.clock ?? Date.now)()): Promise<'renewed' | 'not-due' | 'failed'> {
    this.running ??= this.checkOnce(now).finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  /** Never rejects: whatever fails (the plan, the ask, the answer, onRenewed) is logged and the check is 'failed'. */
  private async checkOnce(now: number): Promise<'renewed' | 'not-due' | 'failed'> {
    const { identity } = this.options;
    try {
      const plan = renewalPlan(identity.cert, now, identity.sshCert);
      if (!plan.due) {
        this.retry.reset();
        return 'not-due';
      }
      this.log.info({ hostId: identity.hostId, why: plan.reason }, 'renewing the host certificates');
      const publicKeyPem = createPublicKey(identity.key).export({ type: 'spki', format: 'pem' }).toString();
      const certs = await this.options.ask(publicKeyPem);
      this.accept(certs, publicKeyPem, now);
      this.log.info({ hostId: identity.hostId, validUntil: new X509Certificate(identity.cert).validTo }, 'host certificates renewed');
      this.retry.reset();
      this.options.onRenewed?.(identity);
      return 'renewed';
    } catch (err) {
      const e = toGatewayError(err);
      this.retryInMs = this.retry.next();
      this.log.warn({ hostId: identity.hostId, code: e.code, err: e.message, retryInMs: this.retryInMs }, `host certificates not renewed; asking again in ${Math.ceil(this.retryInMs / 1000)} s`);
      return 'failed';
    }
  }

  /**
   * Checks what came back against what the agent is (its CA, host, cluster and key; valid now, and not running out
   * before what it has: an older certificate replayed is refused), stores it, and puts it in use.
   */
  private accept(certs: RenewedCerts, publicKeyPem: string, now: number): void {
    const { identity } = this.options;
    const refuse = (why: string) => new GatewayError('GW_ERR_AGENT_IDENTITY', `the renewed host certificate is not this agent's: ${why}`, { hint: 'The current certificates stay in use; check the Proxy and Auth Service versions and logs.' });
    let tls: X509Certificate;
    try {
      tls = new X509Certificate(certs.tlsCert);
    } catch (err) {
      throw refuse(`not a certificate (${(err as Error).message})`);
    }
    const ca = new X509Certificate(identity.hostCa);
    if (!tls.checkIssued(ca) || !tls.verify(ca.publicKey)) throw refuse('not signed by the host CA this agent trusts');
    const renewed = identityFromCert(certs.tlsCert);
    if (renewed.kind !== 'host' || renewed.name !== identity.hostId || renewed.cluster !== identity.cluster) throw refuse(`it names ${renewed.kind} ${renewed.name} of cluster "${renewed.cluster}"`);
    const spki = (k: KeyObject) => k.export({ type: 'spki', format: 'der' });
    if (!spki(tls.publicKey).equals(spki(createPublicKey(publicKeyPem)))) throw refuse('it certifies another key');
    const [from, to] = [Date.parse(tls.validFrom), Date.parse(tls.validTo)];
    if (now < from || now >= to) throw refuse(`it is not valid now (${tls.validFrom} to ${tls.validTo})`);
    if (to < Date.parse(new X509Certificate(identity.cert).validTo)) throw refuse(`it runs out at ${tls.validTo}, before the one in use`);
    // The agent keeps no SSH host CA: the key that signed its SSH certificate at join (from the Auth Service over
    // the pinned TLS connection) is the one a renewed SSH certificate must be signed with.
    const current = parseSshCert(identity.sshCert);
    const ssh = checkHostCert(certs.sshCert.trim(), { caKey: current.signatureKey, hostId: identity.hostId, sshKey: sshPublicKeyFromPem(publicKeyPem), now });
    if ('refusal' in ssh) throw refuse(`the SSH certificate: ${ssh.refusal} (its CA: the one that signed the certificate in use)`);
    if (ssh.cert.validBefore < current.validBefore) throw refuse('the SSH certificate runs out before the one in use');
    const dir = join(this.options.dataDir, 'host');
    writeSecretFile(join(dir, 'cert.pem'), certs.tlsCert);
    writeSecretFile(join(dir, 'ssh-cert.pub'), `${certs.sshCert.trim()}\n`);
    identity.cert = certs.tlsCert;
    identity.sshCert = certs.sshCert.trim();
    identity.identity = renewed;
  }
}

/** A tunnel's renews in flight: each answered by the renewal with its id, failed at its deadline or when the tunnel goes. */
export class PendingRenewals {
  private seq = 0;
  private readonly waiting = new Map<number, { resolve: (c: RenewedCerts) => void; reject: (e: GatewayError) => void; timer: NodeJS.Timeout }>();

  /** Sends a renew through `send` and waits for its answer. */
  ask(send: (id: number) => void, timeoutMs = RENEW_ANSWER_MS): Promise<RenewedCerts> {
    const id = ++this.seq;
    return new Promise<RenewedCerts>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(id);
        reject(new GatewayError('GW_ERR_TUNNEL_TIMEOUT', `the Proxy did not answer the renewal within ${timeoutMs / 1000} s (a Proxy of an earlier version does not renew)`));
      }, timeoutMs);
      timer.unref();
      this.waiting.set(id, { resolve, reject, timer });
      send(id);
    });
  }

  /** The Proxy's answer; one for an id not waited for (late, or never asked) is ignored. Never throws. */
  answer(m: RenewalMessage): void {
    const waiter = this.waiting.get(m.id);
    if (!waiter) return;
    let outcome: RenewedCerts | GatewayError;
    try {
      outcome = m.certs ? { tlsCert: m.certs.tls_cert, sshCert: m.certs.ssh_cert } : answerError(m.error!);
    } catch (err) {
      outcome = toGatewayError(err);
    }
    this.waiting.delete(m.id);
    clearTimeout(waiter.timer);
    if (outcome instanceof GatewayError) waiter.reject(outcome);
    else waiter.resolve(outcome);
  }

  /** The tunnel closed: every renew in flight fails. */
  failAll(reason: string): void {
    for (const [id, waiter] of this.waiting) {
      clearTimeout(waiter.timer);
      waiter.reject(new GatewayError('GW_ERR_TUNNEL_DOWN', `the tunnel closed before the Proxy answered the renewal (${reason})`));
      this.waiting.delete(id);
    }
  }
}

/** The Proxy's error, as a GatewayError of its code when this version knows the code. */
function answerError(error: NonNullable<RenewalMessage['error']>): GatewayError {
  const message = error.message.slice(0, 1024);
  if (!isErrorCode(error.code)) return new GatewayError('GW_ERR_INTERNAL', `${error.code.slice(0, 64)}: ${message}`);
  return new GatewayError(error.code, message, error.hint ? { hint: error.hint.slice(0, 1024) } : {});
}
