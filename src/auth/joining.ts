/**
 * Join tokens and joining: a token (stored hashed, with its service types, expiry and uses) is exchanged once
 * per use for host certificates and a node record. Failed joins are rate limited per source (ratelimit.ts); the
 * token value never reaches a log line. A host that joined renews its certificates without a token
 * (renewHost), for the key it joined with, at most once per RENEW_MIN_INTERVAL_MS.
 */
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import type { Backend } from '../backend/index.js';
import { GatewayError, isGatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import type { AuditLog } from './audit.js';
import { checkRequestKeys, hostOf, HOST_CERT_TTL_MS, type Authorities, type CertBundle } from './authorities.js';
import type { CallerCheck } from './callers.js';
import { renewProofRefusal, sameSshKey, type Identity, type RenewProof } from './pki.js';
import { AttemptLimiter, joinKey, reserveOrRefuse } from './ratelimit.js';
import { JOIN_ROLES, KEYS, NAME_PATTERN, type JoinRole, type NodeRecord, type ProxyRecord, type StoredToken } from './records.js';
import { canonicalName, memberNames, reservedBy, type MemberName } from './reserved.js';
import { tokenId as resourceTokenId, type TokenResource } from './resources/index.js';

export const DEFAULT_TOKEN_TTL_MS = 30 * 60_000;
const MAX_TOKEN_TTL_MS = 7 * 24 * 3600_000;
/** A token is kept this long past its expiry, so that a late join hears "expired" rather than "unknown". */
const KEEP_EXPIRED_MS = 3600_000;
/** Failed joins (unknown, expired, used-up or wrong-type token) per source: 10 in 10 minutes. */
export const JOIN_LIMIT = { maxFailures: 10, windowMs: 10 * 60_000 } as const;

/** The least time between two renewals of one host's certificates; a second ask within it is refused. */
export const RENEW_MIN_INTERVAL_MS = 3600_000;
/**
 * After a refused renewal (wrong key, removed, locked, no tunnel), the least time before this Auth Service looks
 * into the next ask of that host (kept in memory): an agent or a Proxy asking in a loop with a wrong key costs a
 * map lookup per ask, not Backend reads and a log line.
 */
export const RENEW_ASK_GAP_MS = 60_000;
const RENEW_REFUSALS_KEPT = 10_000;

const TOKEN_FAILURES: ReadonlySet<string> = new Set(['GW_ERR_AUTH_TOKEN_UNKNOWN', 'GW_ERR_AUTH_TOKEN_EXPIRED', 'GW_ERR_AUTH_TOKEN_USED', 'GW_ERR_AUTH_TOKEN_WRONG_TYPE']);
type TokenFailure = 'GW_ERR_AUTH_TOKEN_UNKNOWN' | 'GW_ERR_AUTH_TOKEN_EXPIRED' | 'GW_ERR_AUTH_TOKEN_USED' | 'GW_ERR_AUTH_TOKEN_WRONG_TYPE';

/** What an agent sends to join (token, types, names, keys) and where it came from. */
export interface HostRequest {
  token: string;
  roles: JoinRole[];
  nodename: string;
  publicAddrs: string[];
  publicKeyPem: string;
  sshPublicKey: string;
  source: string;
}

/**
 * A host's ask for fresh certificates: its host ID as authenticated (its own certificate, or the tunnel a Proxy
 * authenticated), its public key (PEM), and who carried the ask (a Proxy's ID, "direct" or "local").
 */
export interface RenewRequest {
  hostId: string;
  publicKeyPem: string;
  via: string;
  /**
   * Carried by a Proxy (over the agent's tunnel): the ask must hold the host's fresh proof that it holds its key
   * (pki/proof.ts), so that a Proxy cannot spend the renewals of a host that did not ask.
   */
  carried?: { proof: RenewProof | undefined };
}

/** A joining agent's certificates and its host ID. */
export type JoinedHost = CertBundle & { hostId: string };

/** The key a token is stored under: the SHA-256 of its value. */
function tokenId(token: string): string {
  return createHash('sha256').update(token, 'utf8').digest('hex');
}

/** The short, non-secret form of a token that logs, `gwctl tokens ls` and `rm` use (the resources' token id). */
export const tokenShortId = resourceTokenId;

export interface JoiningDeps {
  backend: Backend;
  clock: () => number;
  callers: CallerCheck;
  authorities: Authorities;
  audit: AuditLog;
  log: Logger;
  /**
   * The names of this process's own members from its configuration (the Auth Service's, and its Proxy's when one
   * runs here): reserved for them, with those the live Proxy records announce (reservedNames).
   */
  memberNames?: readonly MemberName[];
}

export class Joining {
  private readonly limiter: AttemptLimiter;
  /** When each host's last renewal was refused, by carrier (RENEW_ASK_GAP_MS). */
  private readonly renewRefusals = new Map<string, number>();

  constructor(private readonly deps: JoiningDeps) {
    this.limiter = new AttemptLimiter({ ...JOIN_LIMIT, clock: deps.clock });
  }

  async addToken(caller: Identity, options: { roles: JoinRole[]; ttlMs?: number; uses?: number; token?: string }): Promise<{ token: string; id: string; expiresAt: string; roles: JoinRole[] }> {
    await this.deps.callers.authorize(caller, 'token', 'create');
    if (options.roles.length === 0) throw new GatewayError('GW_ERR_RESOURCE_INVALID', 'a token needs at least one type', { hint: `Types: ${JOIN_ROLES.join(', ')}.` });
    for (const role of options.roles) {
      if (!JOIN_ROLES.includes(role)) {
        throw new GatewayError('GW_ERR_RESOURCE_INVALID', `"${role}" is not a token type`, { hint: `Types: ${JOIN_ROLES.join(', ')}.` });
      }
    }
    const ttlMs = options.ttlMs ?? DEFAULT_TOKEN_TTL_MS;
    if (!(ttlMs > 0 && ttlMs <= MAX_TOKEN_TTL_MS)) {
      throw new GatewayError('GW_ERR_RESOURCE_INVALID', `token TTL must be more than 0 and at most ${MAX_TOKEN_TTL_MS / 3600_000} h`);
    }
    const token = options.token ?? randomBytes(16).toString('hex');
    const id = tokenId(token);
    const now = this.deps.clock();
    const record: StoredToken = { id: id.slice(0, 12), roles: [...new Set(options.roles)], expiresAt: now + ttlMs, uses: options.uses ?? 1, used: 0, createdAt: new Date(now).toISOString(), createdBy: caller.name };
    await this.deps.backend.put(KEYS.token(id), JSON.stringify(record), { ttlMs: ttlMs + KEEP_EXPIRED_MS });
    await this.deps.audit.record('token.create', caller, { token: record.id, roles: record.roles });
    return { token, id: record.id, expiresAt: new Date(record.expiresAt).toISOString(), roles: record.roles };
  }

  async listTokens(caller: Identity): Promise<Array<Omit<StoredToken, 'expiresAt'> & { expires: string }>> {
    await this.deps.callers.authorize(caller, 'token', 'list');
    return (await this.stored()).map(({ expiresAt, ...rest }) => ({ ...rest, expires: new Date(expiresAt).toISOString() }));
  }

  /** Every stored token, unchecked (callers authorize first). */
  async stored(): Promise<StoredToken[]> {
    return (await this.deps.backend.range('/tokens/')).map((i) => JSON.parse(i.value) as StoredToken);
  }

  /** Removes a token given either its value or the short id that `tokens ls` shows. */
  async removeToken(caller: Identity, tokenOrId: string): Promise<void> {
    const { backend } = this.deps;
    await this.deps.callers.authorize(caller, 'token', 'delete');
    if (await backend.delete(KEYS.token(tokenId(tokenOrId)))) return;
    for (const item of await backend.range('/tokens/')) {
      if ((JSON.parse(item.value) as StoredToken).id === tokenOrId) {
        await backend.delete(item.key);
        return;
      }
    }
    throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', `no token "${tokenOrId.length > 12 ? tokenShortId(tokenOrId) : tokenOrId}"`);
  }

  /** A token from a manifest as it is stored (GW_ERR_RESOURCE_INVALID when it has expired already). */
  fromManifest(token: TokenResource): { key: string; value: string; ttlMs: number } {
    const now = this.deps.clock();
    const expiresAt = token.metadata.expires ? Date.parse(token.metadata.expires) : now + DEFAULT_TOKEN_TTL_MS;
    if (!(expiresAt > now)) {
      throw new GatewayError('GW_ERR_RESOURCE_INVALID', `token ${tokenShortId(token.metadata.name)}: metadata.expires is in the past`);
    }
    const id = tokenId(token.metadata.name);
    const record: StoredToken = { id: id.slice(0, 12), roles: token.spec.roles as JoinRole[], expiresAt, uses: token.spec.uses ?? 1, used: 0, createdAt: new Date(now).toISOString(), createdBy: 'manifest' };
    return { key: KEYS.token(id), value: JSON.stringify(record), ttlMs: expiresAt - now + KEEP_EXPIRED_MS };
  }

  /**
   * Exchanges a join token for host certificates. The token value never reaches a log line.
   *
   * Order, so that neither a bad request nor a guess costs anything it should not: (1) the whole request is
   * validated (400, nothing looked up); (2) an attempt is reserved for the source (429 when too many failed);
   * (3) the token is checked; (4) the certificates are made; (5) only then is a use of the token consumed.
   */
  async join(request: HostRequest): Promise<JoinedHost> {
    const short = tokenId(request.token).slice(0, 12);
    if (request.roles.length === 0) throw this.refuseJoin(request, 'GW_ERR_AUTH_TOKEN_WRONG_TYPE', 'the join request names no service type');
    validateNodeName(request.nodename);
    checkRequestKeys(request.publicKeyPem, request.sshPublicKey);
    const reservation = reserveOrRefuse(this.limiter, joinKey(request.source), 'join', { token: short, source: request.source, nodename: request.nodename }, this.deps.log);
    try {
      const joined = await this.consumeToken(request);
      reservation.succeed();
      return joined;
    } catch (err) {
      if (err instanceof GatewayError && TOKEN_FAILURES.has(err.code)) reservation.fail();
      else reservation.release();
      throw err;
    }
  }

  /** Host certificates for an agent running in this same process (no token: the process is trusted). */
  async joinLocal(request: { roles: JoinRole[]; nodename: string; publicAddrs: string[]; publicKeyPem: string; sshPublicKey: string }): Promise<JoinedHost> {
    validateNodeName(request.nodename);
    return this.recordHost(await this.makeHost({ ...request, source: 'local', token: 'local' }), 'local');
  }

  private refuseJoin(request: HostRequest, code: TokenFailure, message: string): GatewayError {
    this.deps.log.warn({ token: tokenId(request.token).slice(0, 12), source: request.source, nodename: request.nodename, code }, 'join refused');
    return new GatewayError(code, message);
  }

  /** Checks the token, makes the certificates, then consumes one use with compare-and-swap (racing joins: one wins). */
  private async consumeToken(request: HostRequest): Promise<JoinedHost> {
    const { backend, clock } = this.deps;
    const id = tokenId(request.token);
    let made: { bundle: CertBundle; record: NodeRecord } | undefined;
    for (;;) {
      const item = await backend.get(KEYS.token(id));
      if (!item) throw this.refuseJoin(request, 'GW_ERR_AUTH_TOKEN_UNKNOWN', 'the join token is not known to this cluster');
      const record = JSON.parse(item.value) as StoredToken;
      if (record.expiresAt <= clock()) throw this.refuseJoin(request, 'GW_ERR_AUTH_TOKEN_EXPIRED', `the join token expired at ${new Date(record.expiresAt).toISOString()}`);
      if (record.uses > 0 && record.used >= record.uses) throw this.refuseJoin(request, 'GW_ERR_AUTH_TOKEN_USED', 'the join token has been used up');
      const wrong = request.roles.filter((r) => !record.roles.includes(r));
      if (wrong.length > 0) {
        throw this.refuseJoin(request, 'GW_ERR_AUTH_TOKEN_WRONG_TYPE', `the join token is for ${record.roles.join(', ')}, not for ${wrong.join(', ')}`);
      }
      if (!made) await this.refuseMemberNames(request);
      made ??= await this.makeHost(request);
      const next = { ...record, used: record.used + 1 };
      try {
        await backend.compareAndSwap(KEYS.token(id), item.revision, JSON.stringify(next), { ttlMs: Math.max(1, record.expiresAt - clock()) + KEEP_EXPIRED_MS });
        break;
      } catch (err) {
        if (isGatewayError(err, 'GW_ERR_BACKEND_CONFLICT')) continue;
        throw err;
      }
    }
    return this.recordHost(made, tokenId(request.token).slice(0, 12));
  }

  /**
   * The names reserved for the cluster's members: this process's configured ones, and for every live Proxy
   * (its record) its node name, public and peering hosts, and the names under its public DNS name.
   */
  async reservedNames(): Promise<MemberName[]> {
    const proxies = (await this.deps.backend.range('/proxies/')).flatMap((i): ProxyRecord[] => {
      try {
        return [JSON.parse(i.value) as ProxyRecord];
      } catch {
        return [];
      }
    });
    const announced = proxies.flatMap((p): MemberName[] => {
      const who = `Proxy ${String(p.id).slice(0, 64)} (${String(p.nodename).slice(0, 128)})`;
      const publicHosts = [p.public_addr, ...(Array.isArray(p.public_addrs) ? p.public_addrs : [])].filter((a): a is string => typeof a === 'string').slice(0, 64);
      return [
        ...(typeof p.nodename === 'string' ? [{ name: p.nodename, owner: `the node name of ${who}` }] : []),
        ...publicHosts.map((a) => ({ name: hostOf(a), owner: `the public address of ${who}`, under: true })),
        ...(typeof p.peer_addr === 'string' ? [{ name: hostOf(p.peer_addr), owner: `the peering address of ${who}` }] : []),
      ];
    });
    return memberNames([{ name: this.deps.authorities.clusterName, owner: 'the cluster name' }, ...(this.deps.memberNames ?? []), ...announced]);
  }

  /**
   * An agent's join may not name a Proxy's or an Auth Service's names (reserved.ts): its certificate would then
   * pass a client's chain-and-name check for that member. A Proxy's own join (token type proxy) may: Proxies
   * behind one balancer share its name. Checked after the token (nothing is revealed to a caller without one),
   * before anything is issued or consumed: the token stays usable.
   */
  private async refuseMemberNames(request: HostRequest): Promise<void> {
    if (request.roles.includes('proxy')) return;
    const reserved = await this.reservedNames();
    const asked = [{ what: 'node name', name: request.nodename }, ...request.publicAddrs.map((a) => ({ what: 'public address', name: hostOf(a) }))];
    for (const { what, name } of asked) {
      const owner = reservedBy(name, reserved);
      if (!owner) continue;
      this.deps.log.warn({ token: tokenId(request.token).slice(0, 12), source: request.source, nodename: request.nodename, name, owner: owner.owner }, 'join refused: a name of a cluster member');
      throw new GatewayError('GW_ERR_AUTH_JOIN_NAME_RESERVED', `the ${what} "${name}" is reserved: it is ${owner.name === canonicalName(name) ? '' : `under or covers "${owner.name}", `}${owner.owner}`, {
        hint: `Give the agent a name of its own: ${what === 'node name' ? 'gateway.nodename' : "the services' public_addr (or --public-addr)"} must not be a Proxy's or the Auth Service's name, nor one under a Proxy's public name (apps are served there). The token was not used.`,
        details: { name, reserved: owner.name },
      });
    }
  }

  /**
   * The record as its renewed certificates name it: an agent that joined before member names were reserved keeps
   * its record, but its new certificates leave out the names now reserved (logged once per renewal), so that an
   * old join does not keep a Proxy's name for ever. A Proxy's record is as it is.
   */
  private async withoutMemberNames(record: NodeRecord): Promise<NodeRecord> {
    if (record.roles.includes('proxy')) return record;
    const reserved = await this.reservedNames();
    const publicAddrs = record.publicAddrs.filter((a) => !reservedBy(hostOf(a), reserved));
    const nodenameTaken = reservedBy(record.nodename, reserved) !== undefined;
    if (publicAddrs.length === record.publicAddrs.length && !nodenameTaken) return record;
    const dropped = [...record.publicAddrs.filter((a) => !publicAddrs.includes(a)), ...(nodenameTaken ? [record.nodename] : [])];
    this.deps.log.warn({ hostId: record.hostId, dropped }, "host renewal: names reserved for the cluster's members left out of the certificates");
    // The host ID stands in for a taken node name (certificates need one name; the host ID is always among them).
    return { ...record, publicAddrs, nodename: nodenameTaken ? record.hostId : record.nodename };
  }

  /** The certificates of a new host; nothing is stored. A name the certificates cannot carry is the request's fault (400). */
  private async makeHost(request: HostRequest): Promise<{ bundle: CertBundle; record: NodeRecord }> {
    const hostId = randomUUID();
    const joinedAt = new Date(this.deps.clock()).toISOString();
    const record: NodeRecord = { hostId, nodename: request.nodename, roles: request.roles, publicAddrs: request.publicAddrs, joinedAt, source: request.source, sshPublicKey: request.sshPublicKey };
    return { bundle: await this.issueHost(record, request.publicKeyPem, request.sshPublicKey), record };
  }

  /** Host certificates (TLS and SSH) for a node record's identity and names, for one key. */
  private async issueHost(record: NodeRecord, publicKeyPem: string, sshPublicKey: string): Promise<CertBundle> {
    const { clusterName } = this.deps.authorities;
    const { hostId } = record;
    const principals = [...new Set([hostId, `${hostId}.${clusterName}`, record.nodename, ...record.publicAddrs.map(hostOf)])];
    const identity: Identity = { kind: 'host', name: hostId, cluster: clusterName, roles: record.roles, nodename: record.nodename };
    try {
      return await this.deps.authorities.issueBundle('host', {
        identity,
        publicKeyPem,
        sshPublicKey,
        ttlMs: HOST_CERT_TTL_MS,
        usage: 'both',
        names: principals,
        sshPrincipals: principals,
      });
    } catch (err) {
      if (isGatewayError(err, 'GW_ERR_PKI_BAD_REQUEST')) {
        throw new GatewayError('GW_ERR_API_BAD_REQUEST', `the join request cannot be certified: ${err.message}`, {
          hint: 'Check gateway.nodename and every public_addr of the agent: DNS names or IP addresses.',
          cause: err,
        });
      }
      throw err;
    }
  }

  /**
   * Refuses (too soon, nothing looked up or logged) an ask within RENEW_ASK_GAP_MS of the last refusal of that host
   * through the same carrier (a Proxy's ID, "direct", "local"): a Proxy asking wrongly shuts out only its own asks.
   */
  private checkRenewGap(key: string, hostId: string): void {
    const now = this.deps.clock();
    const last = this.renewRefusals.get(key);
    if (last !== undefined && now - last < RENEW_ASK_GAP_MS && now >= last) {
      throw new GatewayError('GW_ERR_HOST_RENEW_TOO_SOON', `host ${hostId} was refused a renewal through the same way less than ${RENEW_ASK_GAP_MS / 1000} s ago`);
    }
  }

  private noteRenewRefusal(key: string): void {
    const now = this.deps.clock();
    if (this.renewRefusals.size >= RENEW_REFUSALS_KEPT) {
      for (const [id, at] of this.renewRefusals) if (now - at >= RENEW_ASK_GAP_MS || now < at) this.renewRefusals.delete(id);
      if (this.renewRefusals.size >= RENEW_REFUSALS_KEPT) this.renewRefusals.clear(); // 10 000 refused hosts within a minute: start over
    }
    this.renewRefusals.set(key, now);
  }

  /** renewChecked, after the gap check; a refusal (other than too soon) starts a gap for the host. */
  async renewHost(request: RenewRequest): Promise<JoinedHost> {
    const key = `${request.hostId}\0${request.via}`;
    this.checkRenewGap(key, request.hostId);
    try {
      return await this.renewChecked(request);
    } catch (err) {
      if (!isGatewayError(err, 'GW_ERR_HOST_RENEW_TOO_SOON')) this.noteRenewRefusal(key);
      throw err;
    }
  }

  /**
   * Fresh certificates for a host that joined already: the same host ID, roles, names and key, a new validity.
   * Refused (nothing issued, nothing stored) when the host was removed or is locked (resolveCaller's errors),
   * when the key is not the one it joined with, its record holds none, or an ask a Proxy carried lacks the host's
   * fresh proof (GW_ERR_HOST_RENEW_REFUSED), and when it renewed less than RENEW_MIN_INTERVAL_MS ago (GW_ERR_HOST_RENEW_TOO_SOON;
   * also, from renewHost, within RENEW_ASK_GAP_MS of a refusal). The renewal time is stored with
   * compare-and-swap, so of two racing asks one is answered and the other is too soon.
   */
  private async renewChecked(request: RenewRequest): Promise<JoinedHost> {
    const { backend, clock, authorities, callers } = this.deps;
    const { hostId } = request;
    const refuse = (why: string, hint: string) => {
      this.deps.log.warn({ hostId, via: request.via, why }, 'host renewal refused');
      return new GatewayError('GW_ERR_HOST_RENEW_REFUSED', `host ${hostId} cannot renew its certificates: ${why}`, { hint });
    };
    for (let turn = 1; ; turn++) {
      const item = await backend.get(KEYS.node(hostId));
      const record = item ? (JSON.parse(item.value) as NodeRecord) : undefined;
      await callers.resolveCaller({ kind: 'host', name: hostId, cluster: authorities.clusterName, roles: record?.roles ?? [] });
      if (!item || !record) throw refuse('its node record changed while it was read', 'The agent asks again later by itself.');
      if (!record.sshPublicKey) throw refuse('its node record holds no key (it joined before keys were recorded)', "Join it again with a new token from 'gwctl tokens add'.");
      if (!sameSshKey(request.publicKeyPem, record.sshPublicKey)) throw refuse('the key is not the one it joined with', 'Renewal keeps the key; a host with a new key must join again with a new token.');
      const unproven = request.carried && renewProofRefusal(request.carried.proof, hostId, authorities.clusterName, request.publicKeyPem, record.sshPublicKey, clock());
      if (unproven) throw refuse(`${unproven} (asked through ${request.via})`, "Check the agent's clock (date -u); the agent asks again later by itself.");
      const last = record.renewedAt === undefined ? undefined : Date.parse(record.renewedAt);
      if (last !== undefined && clock() - last < RENEW_MIN_INTERVAL_MS) {
        const next = new Date(last + RENEW_MIN_INTERVAL_MS).toISOString();
        throw new GatewayError('GW_ERR_HOST_RENEW_TOO_SOON', `host ${hostId} renewed its certificates at ${record.renewedAt}; the next renewal is possible from ${next}`, {
          hint: 'The agent keeps its current certificates and asks again later by itself; nothing needs doing.',
        });
      }
      const bundle = await this.issueHost(await this.withoutMemberNames(record), request.publicKeyPem, record.sshPublicKey);
      const renewed: NodeRecord = { ...record, renewedAt: new Date(clock()).toISOString() };
      try {
        await backend.compareAndSwap(KEYS.node(hostId), item.revision, JSON.stringify(renewed));
      } catch (err) {
        // Another write to the record (a racing renewal, an edit): read it again, a few times at most.
        if (isGatewayError(err, 'GW_ERR_BACKEND_CONFLICT') && turn < 5) continue;
        throw err;
      }
      this.deps.log.info({ hostId, nodename: record.nodename, via: request.via }, 'host certificates renewed');
      await this.deps.audit.record('host.renew', undefined, { host_id: hostId, nodename: record.nodename, via: request.via });
      return { ...bundle, hostId };
    }
  }

  /**
   * Records that an agent signs its presence (a Proxy carried a valid proof of it: memberchecks.ts): from then on
   * a presence of it from a Proxy in its own process needs one. Idempotent; a racing write is read again.
   */
  async markPresenceSigned(hostId: string): Promise<void> {
    const { backend } = this.deps;
    for (let turn = 1; turn <= 5; turn++) {
      const item = await backend.get(KEYS.node(hostId));
      const record = item ? (JSON.parse(item.value) as NodeRecord) : undefined;
      if (!item || !record || record.signsPresence) return;
      try {
        await backend.compareAndSwap(KEYS.node(hostId), item.revision, JSON.stringify({ ...record, signsPresence: true } satisfies NodeRecord));
        this.deps.log.info({ hostId, nodename: record.nodename }, 'agent signs its presence: unsigned presence of it refused from now on');
        return;
      } catch (err) {
        if (!isGatewayError(err, 'GW_ERR_BACKEND_CONFLICT')) throw err;
      }
    }
  }

  private async recordHost(made: { bundle: CertBundle; record: NodeRecord }, token: string): Promise<JoinedHost> {
    const { record } = made;
    await this.deps.backend.put(KEYS.node(record.hostId), JSON.stringify(record));
    this.deps.log.info({ hostId: record.hostId, nodename: record.nodename, roles: record.roles, token, source: record.source }, 'agent joined');
    await this.deps.audit.record('host.join', undefined, { host_id: record.hostId, nodename: record.nodename, roles: record.roles, token });
    return { ...made.bundle, hostId: record.hostId };
  }
}

function validateNodeName(name: string): void {
  if (!NAME_PATTERN.test(name)) {
    throw new GatewayError('GW_ERR_RESOURCE_INVALID', `"${name}" is not a valid node name`, {
      hint: 'Set gateway.nodename to 1-128 letters, digits, ".", "_" or "-".',
    });
  }
}
