/**
 * Single sign-on (docs/sso.md): sign-in through an OIDC, SAML or code-hosting OAuth connector, for the web page
 * (a web session and its cookie) or for gwsh (certificates, through a one-time code delivered to its loopback
 * callback). One path for all three kinds:
 *
 *   start   the connector → a request stored for 10 minutes (requests.ts) → the identity provider's URL
 *   finish  the callback's state takes the request (once) → the kind's checks (oidc.ts, saml.ts, github.ts) →
 *           the connector's mapping gives roles (none: GW_ERR_SSO_NO_ROLES) → the user record (users.ts) → locks →
 *           a web session, or a grant the console exchanges for certificates
 *
 * Failed callbacks are rate limited per source as password logins are (ratelimit.ts): the source that started the
 * sign-in, and only callbacks naming a stored request count. Starts are limited per source too.
 */
import type { Backend } from '../../backend/index.js';
import type { Dialer } from '../../dial/dialer.js';
import { GatewayError } from '../../errors.js';
import type { Logger } from '../../log.js';
import { recordRateLimited } from '../../metrics/ratelimit.js';
import { sourceKey } from '../../net/source.js';
import type { AuditLog } from '../audit.js';
import { checkRequestKeys, type Authorities, type CertBundle } from '../authorities.js';
import type { CallerCheck } from '../callers.js';
import type { LockStore } from '../locks.js';
import type { Identity } from '../pki.js';
import { AttemptLimiter, type Reservation } from '../ratelimit.js';
import { allowedLogins, maxSessionTtlMs } from '../rbac.js';
import { KEYS, readJson, type StoredUser } from '../records.js';
import { githubRoles, oidcRoles, samlRoles, type GithubConnector, type OidcConnector, type SamlConnector } from '../resources/index.js';
import { randomSecret, sameSecret, sha256hex } from '../../wire/secrets.js';
import { idpFetch, type IdpFetch } from './fetch.js';
import { GithubFlows } from './github.js';
import type { IdpIdentity } from './checks.js';
import type { OidcFlows } from './oidc.js';
import { SSO_KINDS, SsoRequests, type ConsoleRequest, type SsoKind, type SsoRequest } from './requests.js';
import type { SamlFlows } from './saml.js';
import { saveSsoUser, traitsOf } from './users.js';

export { SSO_KINDS, type SsoKind } from './requests.js';
/**
 * Largest SAMLResponse (base64) the ACS reads: with the form's other fields within the 64 KiB that a Proxy in its
 * own process forwards for a client without a certificate (src/client/forward.ts). Responses are a few KiB.
 */
export const MAX_SAML_RESPONSE = 60 * 1024;

type AnyConnector = OidcConnector | SamlConnector | GithubConnector;

/** What a web sign-in creates its session with (src/auth/websessions.ts). */
export interface WebSessionMaker {
  create(identity: Identity, source: string, options: { connector: { kind: SsoKind; name: string }; ttlMs: number }): Promise<{ id: string; expiresAt: number; cookie: string }>;
}

export interface AuthPreference {
  type: 'local' | SsoKind;
  connector?: { kind: SsoKind; name: string; display: string };
}

export interface SsoDeps {
  backend: Backend;
  clock: () => number;
  callers: CallerCheck;
  authorities: Authorities;
  audit: AuditLog;
  locks: LockStore;
  log: Logger;
  /** Outbound requests to identity providers; without one (tests of other parts) SSO cannot reach any. */
  dialer?: Dialer;
  userCertTtlMs: number;
  authentication: { type: 'local' | SsoKind; connector_name: string };
  webSessions?: WebSessionMaker;
}

/** Sign-ins started per source and minute; callbacks are limited like password logins (LOGIN_LIMIT). */
const START_LIMIT = { maxFailures: 30, windowMs: 60_000 } as const;
const FINISH_LIMIT = { maxFailures: 5, windowMs: 5 * 60_000 } as const;
/** gwsh's loopback callback; gwsh adds its own state (older gwsh did not), which the code is sent back with. */
const CONSOLE_REDIRECT = /^http:\/\/127\.0\.0\.1:(\d{1,5})\/callback(?:\?state=[A-Za-z0-9_-]{22,128})?$/;

/** The web mode's result: the session to set as a cookie, and where the browser goes. */
export interface WebFinish {
  mode: 'web';
  /** The session's Set-Cookie value (websessions.ts). */
  session: { id: string; expiresAt: number; cookie: string };
  redirect: string;
}
export interface ConsoleFinish {
  mode: 'console';
  /** gwsh's loopback callback with the one-time code. */
  location: string;
}

/** Where a web sign-in may return to: a path of this origin (not //host, not a backslash trick), else /web/. */
export function safeRedirect(path: string | null | undefined): string {
  if (!path || path.length > 1024 || !path.startsWith('/') || path.startsWith('//') || /[\\\u0000-\u001f\u007f]/.test(path)) return '/web/';
  return path;
}

function unknownConnector(kind: string, name: string): GatewayError {
  return new GatewayError('GW_ERR_SSO_CONNECTOR_UNKNOWN', `there is no ${kind} connector named "${name}"`);
}

export class SsoService {
  readonly requests: SsoRequests;
  // openid-client and node-saml (with its XML stack) are loaded on the first sign-in of their kind, not at start.
  private oidcFlows?: Promise<OidcFlows>;
  private samlFlows?: Promise<SamlFlows>;
  private readonly github: GithubFlows;
  private readonly fetchFor: (ca: string | undefined) => IdpFetch;
  private readonly starts = new AttemptLimiter({ ...START_LIMIT });
  private readonly finishes: AttemptLimiter;

  constructor(private readonly deps: SsoDeps) {
    this.requests = new SsoRequests(deps.backend);
    this.fetchFor = (ca: string | undefined): IdpFetch => {
      if (!deps.dialer) throw new GatewayError('GW_ERR_SSO_IDP_ERROR', 'this Auth Service has no dialer to reach identity providers');
      return idpFetch(deps.dialer, ca);
    };
    this.github = new GithubFlows(this.fetchFor);
    this.finishes = new AttemptLimiter({ ...FINISH_LIMIT, clock: deps.clock });
  }

  private oidc(): Promise<OidcFlows> {
    return (this.oidcFlows ??= import('./oidc.js').then((m) => new m.OidcFlows(this.fetchFor, this.deps.clock)));
  }

  private saml(): Promise<SamlFlows> {
    return (this.samlFlows ??= import('./saml.js').then((m) => new m.SamlFlows(this.fetchFor, this.deps.clock)));
  }

  /** Connectors users may sign in with (no secrets), and the configured default. */
  async connectors(): Promise<{ connectors: Array<{ kind: SsoKind; name: string; display: string }>; default?: string }> {
    const list: Array<{ kind: SsoKind; name: string; display: string }> = [];
    for (const kind of SSO_KINDS) {
      for (const item of await this.deps.backend.range(`/connectors/${kind}/`)) {
        const c = JSON.parse(item.value) as AnyConnector;
        list.push({ kind, name: c.metadata.name, display: c.spec.display ?? c.metadata.name });
      }
    }
    const pref = await this.authPreference(list);
    return { connectors: list, ...(pref.connector ? { default: pref.connector.name } : {}) };
  }

  /** auth_service.authentication as clients see it (/webapi/ping): the default connector when it exists. */
  async authPreference(known?: Array<{ kind: SsoKind; name: string; display: string }>): Promise<AuthPreference> {
    const { type, connector_name } = this.deps.authentication;
    if (type === 'local') return { type };
    const list = known ?? (await this.connectors()).connectors;
    const chosen = list.find((c) => c.kind === type && (connector_name === '' || c.name === connector_name));
    return chosen ? { type, connector: chosen } : { type };
  }

  private async connector(kind: SsoKind, name: string): Promise<AnyConnector> {
    const c = await readJson<AnyConnector>(this.deps.backend, KEYS.connector(kind, name));
    if (!c) throw unknownConnector(kind, name);
    return c;
  }

  /** The connector of a name whatever its kind (gwsh names it alone); "kind/name" picks the kind. */
  private async connectorByName(ref: string): Promise<AnyConnector & { kind: SsoKind }> {
    const [kind, name] = ref.includes('/') ? (ref.split('/', 2) as [string, string]) : [undefined, ref];
    for (const k of SSO_KINDS) {
      if (kind !== undefined && k !== kind) continue;
      const c = await readJson<AnyConnector>(this.deps.backend, KEYS.connector(k, name));
      if (c) return c as AnyConnector & { kind: SsoKind };
    }
    throw unknownConnector(kind ?? 'oidc, saml or github', name);
  }

  private limitStart(source: string): void {
    const r = this.starts.reserve(`start\u0000${sourceKey(source)}`);
    if (!r.ok) {
      recordRateLimited('sso_start');
      throw new GatewayError('GW_ERR_AUTH_RATE_LIMITED', `too many sign-ins started from this address; try again in ${Math.ceil(r.retryAfterMs / 1000)} s`, {
        hint: `At most ${START_LIMIT.maxFailures} single sign-ons may start per address and minute.`,
        details: { retryAfterMs: r.retryAfterMs },
      });
    }
    r.reservation.fail(); // every start counts
  }

  /** The identity provider's URL for a stored request of connector c. */
  private async begin(c: AnyConnector, request: Omit<SsoRequest, 'kind' | 'connector' | 'createdAt'>): Promise<string> {
    const base = { ...request, kind: c.kind as SsoKind, connector: c.metadata.name, createdAt: this.deps.clock() };
    switch (c.kind) {
      case 'oidc': {
        // The state is the request's key: store first, with what the start gives, under a state chosen now.
        const state = randomSecret();
        const start = await (await this.oidc()).start(c, state);
        await this.requests.saveAs(state, { ...base, verifier: start.verifier, nonce: start.nonce });
        return start.url;
      }
      case 'saml': {
        const state = randomSecret();
        const samlRequestId = `_${randomSecret()}`;
        const url = await (await this.saml()).start(c, state, samlRequestId);
        await this.requests.saveAs(state, { ...base, samlRequestId });
        return url;
      }
      case 'github': {
        const state = randomSecret();
        const start = this.github.start(c, state);
        await this.requests.saveAs(state, { ...base, verifier: start.verifier });
        return start.url;
      }
    }
  }

  /** Web mode: the IdP URL, and the browser-binding value to set as a cookie (its hash is kept with the request). */
  async startWeb(kind: SsoKind, name: string, redirect: string | null, source: string): Promise<{ url: string; binding: string }> {
    this.limitStart(source);
    const c = await this.connector(kind, name);
    const binding = randomSecret();
    const url = await this.begin(c, { mode: 'web', redirect: safeRedirect(redirect), browserHash: sha256hex(binding), source });
    return { url, binding };
  }

  /** Console mode (gwsh login --auth): the URL to open and the request ID to exchange the code with. */
  async startConsole(ref: string, console: Omit<ConsoleRequest, 'requestId'>, source: string): Promise<{ auth_url: string; request_id: string }> {
    this.limitStart(source);
    checkRequestKeys(console.publicKeyPem, console.sshPublicKey);
    const port = Number(CONSOLE_REDIRECT.exec(console.redirectUrl)?.[1] ?? 0);
    if (!(port > 0 && port < 65536)) {
      throw new GatewayError('GW_ERR_API_BAD_REQUEST', '"redirect_url" must be http://127.0.0.1:<port>/callback, optionally with ?state=<22-128 characters of A-Z a-z 0-9 _ -> (the console\'s own loopback listener)');
    }
    if (!/^[0-9a-f]{64}$/.test(console.secretHash)) throw new GatewayError('GW_ERR_API_BAD_REQUEST', '"secret_hash" must be a SHA-256 in hex');
    const c = await this.connectorByName(ref);
    const requestId = randomSecret();
    const url = await this.begin(c, { mode: 'console', console: { ...console, requestId }, source });
    return { auth_url: url, request_id: requestId };
  }

  /** The kind's own checks of the callback: who the provider says signed in. */
  private async verify(c: AnyConnector, request: SsoRequest, state: string, callback: { query?: URLSearchParams; samlResponse?: string }): Promise<IdpIdentity> {
    switch (c.kind) {
      case 'oidc':
        return (await this.oidc()).finish(c, callback.query ?? new URLSearchParams(), { state, verifier: request.verifier!, nonce: request.nonce! });
      case 'saml':
        if (!callback.samlResponse) throw new GatewayError('GW_ERR_API_BAD_REQUEST', 'the ACS request carries no SAMLResponse');
        return (await this.saml()).finish(c, callback.samlResponse, { requestId: request.samlRequestId!, createdAt: request.createdAt });
      case 'github':
        return this.github.finish(c, callback.query ?? new URLSearchParams(), request.verifier!);
    }
  }

  private rolesFor(c: AnyConnector, idp: IdpIdentity): string[] {
    switch (c.kind) {
      case 'oidc':
        return oidcRoles(c, idp.claims);
      case 'saml':
        return samlRoles(c, idp.claims as Record<string, string[]>);
      case 'github':
        return githubRoles(c, idp.claims.teams as Array<{ organization: string; team: string }>);
    }
  }

  /**
   * A callback: state → request (once) → the provider's answer checked → roles → user record → locks → the web
   * session, or the console's grant. Rate limited per source that started the request; every refusal is audited.
   */
  async finish(kind: SsoKind, callback: { state: string | null; query?: URLSearchParams; samlResponse?: string; browserBinding?: string; source: string }): Promise<WebFinish | ConsoleFinish> {
    const { source } = callback;
    let reservation: Reservation | undefined;
    let request: SsoRequest | undefined;
    try {
      request = await this.requests.take(callback.state);
      // Counted against the address that started this sign-in, and only once a stored request is named: a made-up
      // state gives nothing (256 random bits), and any web page can make a browser send one (a GET), so counting it
      // against the browser's address would let a page lock everyone behind that address out.
      reservation = this.reserveFinish(request.source);
      if (request.kind !== kind) throw new GatewayError('GW_ERR_SSO_STATE_INVALID', `this sign-in request was started for a ${request.kind} connector, not ${kind}`);
      if (request.mode === 'web' && (!callback.browserBinding || !sameSecret(callback.browserBinding, request.browserHash))) {
        throw new GatewayError('GW_ERR_SSO_STATE_INVALID', 'this sign-in was started in another browser (its binding cookie is missing or different)', {
          hint: 'Start the sign-in again in this browser; a sign-in link cannot be handed to someone else.',
        });
      }
      const c = await this.connector(request.kind, request.connector);
      const idp = await this.verify(c, request, callback.state!, callback);
      const result = await this.grant(c, request, idp);
      reservation.succeed();
      return result;
    } catch (err) {
      reservation?.fail();
      const e = err as GatewayError;
      await this.deps.audit.record('user.login.failure', undefined, { method: 'sso', kind, ...(request ? { connector: request.connector } : {}), source, code: e.code ?? 'GW_ERR_INTERNAL', error: e.message });
      throw err;
    }
  }

  private reserveFinish(source: string): Reservation {
    const r = this.finishes.reserve(`finish\u0000${sourceKey(source)}`);
    if (r.ok) return r.reservation;
    recordRateLimited('sso_finish');
    throw new GatewayError('GW_ERR_AUTH_RATE_LIMITED', `too many failed single sign-ons from this address; try again in ${Math.ceil(r.retryAfterMs / 1000)} s`, {
      hint: `At most ${FINISH_LIMIT.maxFailures} failed sign-ins per address in ${FINISH_LIMIT.windowMs / 60_000} minutes; wait, then sign in again.`,
      details: { retryAfterMs: r.retryAfterMs },
    });
  }

  /** Roles, the user record, locks, then the session or the console's grant. */
  private async grant(c: AnyConnector, request: SsoRequest, idp: IdpIdentity): Promise<WebFinish | ConsoleFinish> {
    const { deps } = this;
    const kind = c.kind as SsoKind;
    const roles = this.rolesFor(c, idp);
    if (roles.length === 0) {
      throw new GatewayError('GW_ERR_SSO_NO_ROLES', `the ${kind} connector "${c.metadata.name}" maps no role to ${idp.username}`);
    }
    await deps.callers.requireRolesExist(roles);
    await deps.locks.check({ user: idp.username, roles });
    const traits = traitsOf(kind === 'github' ? { logins: [idp.username], github_teams: (idp.claims.teams as Array<{ organization: string; team: string }>).map((t) => `${t.organization}/${t.team}`) } : idp.claims);
    const now = deps.clock();
    const ttlMs = Math.min(deps.userCertTtlMs, maxSessionTtlMs(await deps.callers.rolesOf(roles)) ?? Infinity);
    await saveSsoUser(deps.backend, now, { name: idp.username, roles, traits, kind, connector: c.metadata.name }, now + ttlMs);
    const logins = allowedLogins(await deps.callers.rolesOf(roles), traits);
    const connector = { kind, name: c.metadata.name };
    await deps.audit.record('user.login', undefined, { user: idp.username, method: request.mode === 'web' ? 'web' : 'sso', connector, source: request.source, roles });
    if (request.mode === 'console') {
      const code = randomSecret();
      const console = request.console!;
      await this.requests.saveGrant({ codeHash: sha256hex(code), secretHash: console.secretHash, user: idp.username, console, connector });
      const location = new URL(console.redirectUrl);
      location.searchParams.set('code', code);
      return { mode: 'console', location: location.href };
    }
    if (!deps.webSessions) throw new GatewayError('GW_ERR_INTERNAL', 'web sessions are not available in this Auth Service');
    const identity: Identity = { kind: 'user', name: idp.username, cluster: deps.authorities.clusterName, roles, logins };
    const session = await deps.webSessions.create(identity, request.source, { connector, ttlMs });
    return { mode: 'web', session, redirect: request.redirect ?? '/web/' };
  }

  /** gwsh's exchange of the one-time code (and its secret) for certificates, as a password login gives. */
  async exchange(requestId: string, code: string, secret: string, source: string): Promise<CertBundle> {
    const reservation = this.reserveFinish(source);
    try {
      const grant = await this.requests.takeGrant(requestId, code, secret);
      const bundle = await this.issue(grant.user, grant.console);
      reservation.succeed();
      return bundle;
    } catch (err) {
      reservation.fail();
      throw err;
    }
  }

  private async issue(user: string, console: ConsoleRequest): Promise<CertBundle> {
    const { deps } = this;
    const stored = await readJson<StoredUser>(deps.backend, KEYS.user(user));
    if (!stored?.resource.spec.created_by) throw new GatewayError('GW_ERR_AUTH_IDENTITY_REVOKED', `user "${user}" no longer exists in this cluster`);
    const roles = stored.resource.spec.roles;
    await deps.locks.check({ user, roles });
    const traits = stored.resource.spec.traits ?? {};
    const logins = allowedLogins(await deps.callers.rolesOf(roles), traits);
    const identity: Identity = { kind: 'user', name: user, cluster: deps.authorities.clusterName, roles, logins };
    const expires = Date.parse(stored.resource.metadata.expires ?? '');
    // The SSO user's record expires when the session its sign-in allowed ends (max_session_ttl included).
    const ttlMs = Math.max(60_000, Math.min(deps.userCertTtlMs, Number.isNaN(expires) ? deps.userCertTtlMs : expires - deps.clock()));
    return deps.authorities.issueBundle('user', {
      identity,
      publicKeyPem: console.publicKeyPem,
      sshPublicKey: console.sshPublicKey,
      ttlMs,
      usage: 'client',
      names: [],
      sshPrincipals: logins.length > 0 ? logins : [`-gw-no-login-${user}`],
    });
  }
}
