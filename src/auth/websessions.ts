/**
 * Web sessions: the credentials of the browser (docs/security.md, "The web surface").
 *
 * A web session is created by a password login on the web (POST /webapi/sessions) or by an SSO callback, and
 * lives in the Backend at /web_sessions/<sha256 hex of its id>: who (user, roles, logins, traits, the connector),
 * when (created, expires) and the sha256 of its bearer token. The id travels in the `__Host-gw_session` cookie;
 * the bearer in the page's memory and an Authorization header. Both are 32 random bytes, base64url; neither is
 * stored, so a copy of the Backend gives neither.
 *
 * Every use checks, in order: the id's form, the record, the bearer (the same session's), the expiry by this
 * service's clock, then the caller as it stands now (CallerCheck.resolveCaller: a removed user, a lock, a lost
 * role count at once, exactly as for certificates).
 *
 * Besides: the one-time bearer handout after an SSO callback (the redirect cannot carry it), SSH certificates for
 * the web terminal, and app sessions: a launch token (single use, 60 s, bound to the launch nonce the app's host
 * set in the browser that asked for it) that the app's host redeems for an app session bound to that app and to
 * its parent web session, which ends with it.
 */
import { createHash } from 'node:crypto';
import type { Backend } from '../backend/index.js';
import { GatewayError } from '../errors.js';
import { randomSecret, sameSecret, sha256hex } from '../wire/secrets.js';
import type { Logger } from '../log.js';
import type { AuditLog } from './audit.js';
import type { Authorities } from './authorities.js';
import type { CallerCheck } from './callers.js';
import { issueSshCert, type Identity } from './pki.js';
import { blobFromLine, keyFromBlob } from './pki/sshwire.js';
import { checkAccess, maxSessionTtlMs, type Verb } from './rbac.js';
import { KEYS, readJson, type StoredUser } from './records.js';

/** The cookie of a web session; `__Host-`: Secure, Path=/, no Domain, so no other host can set or read it. */
export const WEB_SESSION_COOKIE = '__Host-gw_session';
/** The cookie of an app session, on the app's own host. */
export const APP_SESSION_COOKIE = '__Host-gw_app';
/** The launch nonce, on the app's own host: a launch token is good only in the browser that holds it. */
export const APP_LAUNCH_NONCE_COOKIE = '__Host-gw_launch';
/** The longest web session, whatever the certificate lifetime is set to. */
export const MAX_WEB_SESSION_MS = 30 * 3600_000;
/** An app launch token lives this long, and is good once. */
export const APP_LAUNCH_TTL_MS = 60_000;
/** SSH certificates for the web terminal: at most this long, and never past the session. */
export const WEB_SSH_CERT_MAX_MS = 3600_000;
/** An expired session is kept this long, so that its use says "expired" rather than "unknown". */
const EXPIRED_KEPT_MS = 3600_000;
/** 32 bytes, base64url without padding. */
const SECRET_FORM = /^[A-Za-z0-9_-]{43}$/;
const APP_NAME_MAX = 256;

export const WEB_KEYS = {
  session: (idHash: string) => `/web_sessions/${idHash}`,
  appLaunch: (tokenHash: string) => `/web_app_launches/${tokenHash}`,
};

export interface SsoConnectorRef {
  kind: string;
  name: string;
}

/** A web (or app) session as the Proxy and the API see it: its caller as it stands now. */
export interface WebSessionView {
  id: string;
  identity: Identity;
  /** ms since the epoch. */
  expiresAt: number;
  connector?: SsoConnectorRef;
}

/** What createWebSession gives: the secrets (shown once) and the Set-Cookie value. */
export interface CreatedWebSession {
  id: string;
  bearer: string;
  expiresAt: number;
  /** The Set-Cookie header value for this session. */
  cookie: string;
}

export interface CreateWebSessionOptions {
  /** The SSO connector the user came through. */
  connector?: SsoConnectorRef;
  /** Shorter than the default lifetime (an SSO assertion's own end); never longer. */
  ttlMs?: number;
  /**
   * Whether the page may fetch the bearer once with the cookie (POST /webapi/sessions/bearer). Default true: an
   * SSO callback redirects the browser and cannot give the page the bearer; a password login answers it in its
   * body and sets false.
   */
  bearerHandout?: boolean;
}

interface StoredWebSession {
  kind: 'web' | 'app';
  user: string;
  roles: string[];
  logins: string[];
  traits: Record<string, string[]>;
  connector?: SsoConnectorRef;
  createdAt: number;
  expiresAt: number;
  source: string;
  /** web: sha256 hex of the bearer. */
  bearerHash?: string;
  /** web: the bearer may still be handed out once with the cookie alone. */
  handoutPending?: boolean;
  /** app: the app it is bound to, and the key hash of its parent web session. */
  app?: string;
  parent?: string;
}

interface StoredAppLaunch {
  app: string;
  parent: string;
  user: string;
  expiresAt: number;
  /** sha256 hex of the launch nonce (the app host's cookie in the browser that asked). */
  stateHash: string;
}

/** What the page shows and offers, from the user's rules (the API enforces them anyway). */
export interface WebAcl {
  /**
   * grant: the roles may create a role and set a user's roles (the preset editor), so the page may show how to give
   * the maintenance window's role, which no preset role holds (docs/web.md), to one who lacks read.
   */
  maintenance: { read: boolean; update: boolean; grant: boolean };
  tokens: { list: boolean; create: boolean; delete: boolean };
  events: { list: boolean };
  /** The agents view (src/proxy/web.ts): the node rule's list or read, as `gwctl get nodes`. */
  agents: { list: boolean };
  /** The agents page's rollout panel (GET /webapi/autoupdate/status): the rule autoupdate_agent_rollout with read. */
  rollout: { read: boolean };
}

export interface WebSessionsDeps {
  backend: Backend;
  clock: () => number;
  callers: CallerCheck;
  authorities: Authorities;
  audit: AuditLog;
  log: Logger;
  /** The lifetime of user certificates (login's): a web session's lifetime, capped by MAX_WEB_SESSION_MS. */
  userCertTtlMs: number;
}


/** The Set-Cookie value of a web session with maxAgeS seconds left (0: clears it). */
export function sessionCookie(id: string, maxAgeS: number, name = WEB_SESSION_COOKIE): string {
  return `${name}=${id}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=${Math.max(0, Math.floor(maxAgeS))}`;
}

/** The Set-Cookie value that makes the browser forget the web session cookie. */
export function clearedCookie(name = WEB_SESSION_COOKIE): string {
  return sessionCookie('', 0, name);
}

/** Longest Cookie header read for our cookie (the listener caps the whole head anyway). */
const MAX_COOKIE_HEADER = 8192;

/**
 * The value of cookie `name` in a Cookie header (first occurrence), or undefined. Bounded; never throws. A value
 * that is not of our form is returned as is: the caller refuses it (GW_ERR_WEB_SESSION_INVALID).
 */
export function cookieValue(header: string | string[] | undefined, name: string): string | undefined {
  if (header === undefined) return undefined;
  const text = Array.isArray(header) ? header.join('; ') : header;
  // Not read at length: a value of no session's form, refused as malformed.
  if (text.length > MAX_COOKIE_HEADER) return 'too-large';
  for (const part of text.split(';')) {
    const eq = part.indexOf('=');
    if (eq < 0) continue;
    if (part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

/**
 * GW_ERR_WEB_CSRF when a request's Origin header is present and is not https:// + the host the request addressed
 * (`host`: Host, `:authority`, or what a Proxy forwarded), or undefined when it matches or is absent. The one
 * comparison of the Auth API router (api.ts) and the Proxy's web routes (src/proxy/webcredentials.ts checkOrigin).
 */
export function originRefusal(given: string | string[] | undefined, host: string | undefined, method: string | undefined): GatewayError | undefined {
  if (given === undefined) return undefined;
  const refuse = (why: string) =>
    new GatewayError('GW_ERR_WEB_CSRF', `refused a ${method ?? 'request'} from another origin: ${why}`, {
      hint: `Use the web UI from its own address${host ? ` (https://${host})` : ''}; requests from other sites are refused.`,
    });
  if (typeof given !== 'string' || given.length > 1024) return refuse('the Origin header is malformed');
  if (!host) return refuse('the request names no host to compare the Origin with');
  let own: string;
  let theirs: string;
  try {
    own = new URL(`https://${host}`).origin;
    theirs = new URL(given).origin;
  } catch {
    return refuse(`Origin "${given.slice(0, 200)}" is not an origin`);
  }
  return theirs === own ? undefined : refuse(`Origin ${theirs === 'null' ? '"null"' : theirs} is not ${own}`);
}

/** The token of an `Authorization: Bearer <token>` header, or undefined. */
export function bearerOf(header: string | string[] | undefined): string | undefined {
  if (typeof header !== 'string') return undefined;
  const m = /^Bearer +(\S{1,512})\s*$/i.exec(header);
  return m ? m[1] : undefined;
}

const SIGN_IN_HINT = 'Sign in again on the web page.';

export function sessionMissing(why = 'no web session cookie was sent'): GatewayError {
  return new GatewayError('GW_ERR_WEB_SESSION_MISSING', `not signed in: ${why}`, {
    hint: 'Sign in on the web page (the session cookie is sent only over HTTPS to this very host), or use a client certificate (gwsh login).',
  });
}

export function sessionInvalid(why: string): GatewayError {
  return new GatewayError('GW_ERR_WEB_SESSION_INVALID', `the web session is not valid: ${why}`, { hint: SIGN_IN_HINT });
}

function sessionExpired(at: number): GatewayError {
  return new GatewayError('GW_ERR_WEB_SESSION_EXPIRED', `the web session expired at ${new Date(at).toISOString()}`, {
    hint: 'Sign in again: a web session lasts as long as a user certificate would.',
  });
}


/** A launch token bound to another nonce (or to none the browser holds): never redeemed. */
export function launchUnbound(why: string): GatewayError {
  return new GatewayError('GW_ERR_WEB_APP_LAUNCH_UNBOUND', `the app launch is not bound to this browser: ${why}`, {
    hint: "Open the app from the Web UI's resources page in this browser; a launch link someone else gave you is refused on purpose.",
  });
}

/** Whether state has the form of a launch nonce (randomSecret). */
export function isLaunchNonce(state: unknown): state is string {
  return typeof state === 'string' && SECRET_FORM.test(state);
}

function checkAppName(app: string): void {
  if (typeof app !== 'string' || app.length === 0 || app.length > APP_NAME_MAX) {
    throw new GatewayError('GW_ERR_API_BAD_REQUEST', `"app" must be an app name of 1-${APP_NAME_MAX} characters`);
  }
}

/**
 * How the audit log names a Web UI app session: a hash of its id (the id is the cookie's secret and never written).
 * This app.session.start and the Proxy's app.session.end (src/proxy/sessionaudit.ts) carry the same one.
 */
export function appSessionRef(sessionId: string): string {
  return createHash('sha256').update(`app-session\u0000${sessionId}`).digest('hex').slice(0, 24);
}

export class WebSessions {
  constructor(private readonly deps: WebSessionsDeps) {}

  private get lifetimeMs(): number {
    return Math.min(this.deps.userCertTtlMs, MAX_WEB_SESSION_MS);
  }

  /** A new web session for identity (a user that has just proved who it is). */
  async create(identity: Identity, source: string, options: CreateWebSessionOptions = {}): Promise<CreatedWebSession> {
    if (identity.kind !== 'user') throw new GatewayError('GW_ERR_INTERNAL', `web sessions are for users, not ${identity.kind} identities`);
    const now = this.deps.clock();
    const cap = maxSessionTtlMs(await this.deps.callers.rolesOf(identity.roles)) ?? Infinity;
    const ttlMs = Math.min(options.ttlMs ?? this.lifetimeMs, this.lifetimeMs, cap);
    if (!(ttlMs > 0)) throw new GatewayError('GW_ERR_INTERNAL', 'a web session needs a positive lifetime');
    const stored = await readJson<StoredUser>(this.deps.backend, KEYS.user(identity.name));
    const id = randomSecret();
    const bearer = randomSecret();
    const record: StoredWebSession = {
      kind: 'web',
      user: identity.name,
      roles: identity.roles,
      logins: identity.logins ?? [],
      traits: stored?.resource.spec.traits ?? {},
      ...(options.connector ? { connector: { kind: options.connector.kind, name: options.connector.name } } : {}),
      createdAt: now,
      expiresAt: now + ttlMs,
      source,
      bearerHash: sha256hex(bearer),
      handoutPending: options.bearerHandout ?? true,
    };
    await this.deps.backend.create(WEB_KEYS.session(sha256hex(id)), JSON.stringify(record), { ttlMs: ttlMs + EXPIRED_KEPT_MS });
    return { id, bearer, expiresAt: record.expiresAt, cookie: sessionCookie(id, ttlMs / 1000) };
  }

  /** The stored record of a session id, checked for form, existence and kind (not the bearer, not expiry). */
  private async record(id: string | undefined, kind: 'web' | 'app'): Promise<{ record: StoredWebSession; key: string; revision: number }> {
    if (id === undefined || id === '') throw kind === 'web' ? sessionMissing() : sessionInvalid('no app session cookie');
    if (!SECRET_FORM.test(id)) throw sessionInvalid('the session cookie is malformed');
    const key = WEB_KEYS.session(sha256hex(id));
    const item = await this.deps.backend.get(key);
    if (!item) throw sessionInvalid('no such session (signed out, or it ended long ago)');
    const record = JSON.parse(item.value) as StoredWebSession;
    if (record.kind !== kind) throw sessionInvalid(`this is not a ${kind} session`);
    return { record, key, revision: item.revision };
  }

  private checkBearer(record: StoredWebSession, bearer: string | undefined): void {
    if (bearer === undefined) throw sessionInvalid('the request carries no bearer token (Authorization: Bearer) of the session');
    if (!sameSecret(bearer, record.bearerHash)) throw sessionInvalid('the bearer token is not the one of this session');
  }

  private checkExpiry(record: StoredWebSession): void {
    if (this.deps.clock() >= record.expiresAt) throw sessionExpired(record.expiresAt);
  }

  /** The caller of a session as it stands now (removed user, lock, lost role: as for certificates). */
  private async view(id: string, record: StoredWebSession): Promise<WebSessionView> {
    const identity = await this.deps.callers.resolveCaller({
      kind: 'user',
      name: record.user,
      cluster: this.deps.authorities.clusterName,
      roles: record.roles,
      logins: record.logins,
      issuedAt: record.createdAt,
    });
    return { id, identity, expiresAt: record.expiresAt, ...(record.connector ? { connector: record.connector } : {}) };
  }

  /** A web session by cookie and bearer: refused unless both are of one live session and its user passes. */
  async resolve(id: string | undefined, bearer: string | undefined): Promise<WebSessionView> {
    const { record } = await this.record(id, 'web');
    this.checkBearer(record, bearer);
    this.checkExpiry(record);
    return this.view(id!, record);
  }

  /**
   * Signs out: deletes the session (cookie and bearer must match; an expired session may be signed out, and so
   * may a locked user: signing out never needs more than the session).
   */
  async delete(id: string | undefined, bearer: string | undefined): Promise<void> {
    const { record, key } = await this.record(id, 'web');
    this.checkBearer(record, bearer);
    await this.deps.backend.delete(key);
    await this.deps.audit.record('web.logout', { kind: 'user', name: record.user, cluster: this.deps.authorities.clusterName, roles: record.roles }, {});
  }

  /**
   * The bearer of a session created by an SSO callback, handed out once with the cookie alone: a new bearer is
   * drawn and stored (compare-and-swap: of two concurrent handouts one wins), and the handout is closed.
   */
  async handoutBearer(id: string | undefined): Promise<{ view: WebSessionView; bearer: string }> {
    const { record, key, revision } = await this.record(id, 'web');
    this.checkExpiry(record);
    const refused = () => sessionInvalid('the bearer token of this session was handed out already');
    if (!record.handoutPending) throw refused();
    const view = await this.view(id!, record);
    const bearer = randomSecret();
    const updated: StoredWebSession = { ...record, bearerHash: sha256hex(bearer), handoutPending: false };
    const left = record.expiresAt - this.deps.clock();
    try {
      await this.deps.backend.compareAndSwap(key, revision, JSON.stringify(updated), { ttlMs: left + EXPIRED_KEPT_MS });
    } catch {
      throw refused();
    }
    return { view, bearer };
  }

  /** An SSH user certificate for the session's user (principals: its logins now), until min(session end, 1 h). */
  async sshCert(id: string, bearer: string | undefined, sshPublicKey: string): Promise<{ ssh_cert: string }> {
    const view = await this.resolve(id, bearer);
    try {
      keyFromBlob(blobFromLine(sshPublicKey).blob);
    } catch {
      throw new GatewayError('GW_ERR_API_BAD_KEY', '"ssh_public_key" is not an OpenSSH public key line of a supported type');
    }
    const ttlMs = Math.min(view.expiresAt - this.deps.clock(), WEB_SSH_CERT_MAX_MS);
    const logins = view.identity.logins ?? [];
    const sshCert = issueSshCert(this.deps.authorities.user, {
      publicKey: sshPublicKey,
      certType: 'user',
      keyId: view.identity.name,
      principals: logins.length > 0 ? logins : [`-gw-no-login-${view.identity.name}`],
      ttlMs,
      clock: this.deps.clock,
    });
    return { ssh_cert: sshCert };
  }

  /**
   * A launch token for app (single use, 60 s), for the session's user, bound to state: the nonce the app's host set
   * in the browser that asked (only its hash is kept). Access to the app is the Proxy's check.
   */
  async createAppLaunch(id: string, bearer: string | undefined, app: string, state: string): Promise<{ token: string }> {
    checkAppName(app);
    if (!isLaunchNonce(state)) throw new GatewayError('GW_ERR_API_BAD_REQUEST', '"state" must be the launch nonce of the app\'s host (43 base64url characters)', { hint: "Open the app from the Web UI's resources page: the app's host gives the page its nonce." });
    const view = await this.resolve(id, bearer);
    const token = randomSecret();
    const launch: StoredAppLaunch = { app, parent: sha256hex(id), user: view.identity.name, expiresAt: this.deps.clock() + APP_LAUNCH_TTL_MS, stateHash: sha256hex(state) };
    await this.deps.backend.create(WEB_KEYS.appLaunch(sha256hex(token)), JSON.stringify(launch), { ttlMs: APP_LAUNCH_TTL_MS });
    return { token };
  }

  /**
   * Redeems a launch token for an app session bound to app and to the parent web session. The token is spent by
   * the first attempt, right or wrong (deleted before anything else is checked). state is the nonce the browser
   * holds (the app's host checked its cookie against it): it must be the one the token was bound to.
   */
  async redeemAppLaunch(token: string, app: string, state: string): Promise<{ sessionId: string; expiresAt: number }> {
    checkAppName(app);
    const invalid = (why: string) => sessionInvalid(`the app launch token ${why}`);
    if (typeof token !== 'string' || !SECRET_FORM.test(token)) throw invalid('is malformed');
    const key = WEB_KEYS.appLaunch(sha256hex(token));
    const item = await this.deps.backend.get(key);
    if (!item || !(await this.deps.backend.delete(key))) throw invalid('is unknown or was used already');
    const launch = JSON.parse(item.value) as StoredAppLaunch;
    if (this.deps.clock() >= launch.expiresAt) throw invalid('expired');
    if (launch.app !== app) throw invalid(`is for another app, not "${app}"`);
    if (!isLaunchNonce(state) || !sameSecret(state, launch.stateHash)) throw launchUnbound('the token was bound to another launch nonce than the one this browser holds');
    const parentItem = await this.deps.backend.get(WEB_KEYS.session(launch.parent));
    if (!parentItem) throw invalid('belongs to a web session that ended');
    const parent = JSON.parse(parentItem.value) as StoredWebSession;
    this.checkExpiry(parent);
    await this.view('', parent);
    const sessionId = randomSecret();
    const now = this.deps.clock();
    const record: StoredWebSession = {
      kind: 'app',
      user: parent.user,
      roles: parent.roles,
      logins: parent.logins,
      traits: parent.traits,
      ...(parent.connector ? { connector: parent.connector } : {}),
      createdAt: now,
      expiresAt: parent.expiresAt,
      source: parent.source,
      app,
      parent: launch.parent,
    };
    await this.deps.backend.create(WEB_KEYS.session(sha256hex(sessionId)), JSON.stringify(record), { ttlMs: parent.expiresAt - now + EXPIRED_KEPT_MS });
    const caller = { kind: 'user', name: parent.user, cluster: this.deps.authorities.clusterName, roles: parent.roles } as const;
    await this.deps.audit.record('app.session.start', caller, { app, user: parent.user, app_session: appSessionRef(sessionId) });
    return { sessionId, expiresAt: record.expiresAt };
  }

  /** An app session by its cookie, for app only, while its parent web session lives. */
  async resolveAppSession(sessionId: string | undefined, app: string): Promise<WebSessionView> {
    const { record } = await this.record(sessionId, 'app');
    if (record.app !== app) throw sessionInvalid(`this app session is for another app, not "${app}"`);
    this.checkExpiry(record);
    const parentItem = await this.deps.backend.get(WEB_KEYS.session(record.parent ?? ''));
    if (!parentItem) throw sessionInvalid('the web session this app session came from has ended (signed out)');
    this.checkExpiry(JSON.parse(parentItem.value) as StoredWebSession);
    // The app session counts from its own creation: a user removed and created again since is refused.
    return this.view(sessionId!, record);
  }

  /** The page's view of the rules of identity's roles (as resolved now). */
  async acl(identity: Identity): Promise<WebAcl> {
    const roles = await this.deps.callers.rolesOf(identity.roles);
    const may = (resource: string, verb: Verb) => checkAccess(roles, resource, verb).allowed;
    return {
      maintenance: {
        read: may('cluster_maintenance_config', 'read'),
        update: may('cluster_maintenance_config', 'update'),
        grant: may('role', 'create') && may('user', 'update'),
      },
      tokens: { list: may('token', 'list'), create: may('token', 'create'), delete: may('token', 'delete') },
      events: { list: may('event', 'list') },
      agents: { list: may('node', 'list') || may('node', 'read') },
      rollout: { read: may('autoupdate_agent_rollout', 'read') },
    };
  }
}
