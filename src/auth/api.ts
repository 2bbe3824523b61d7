/**
 * The Auth Service over HTTPS: JSON in, JSON out, one router for both places it is served.
 *
 *   public (no client certificate needed)     authenticated (client certificate, or web session: below)
 *   GET  /webapi/ca                            GET    /v1/status
 *   POST /webapi/join                          GET    /v1/users            POST /v1/users
 *   POST /webapi/login                         PUT    /v1/users/:name/roles DELETE /v1/users/:name
 *   POST /webapi/sessions      (web login)     GET    /v1/tokens           POST /v1/tokens   DELETE /v1/tokens/:id
 *   GET  /webapi/sessions/current              GET    /v1/events?limit=N   (newest first)
 *   DELETE /webapi/sessions    (sign out)
 *   POST /webapi/sessions/bearer (after SSO)
 *                                              POST   /v1/resources        (a YAML manifest; validated here)
 *                                              POST   /v1/resources/apply  (gwctl apply: files, dry_run, prune, set)
 *                                              GET    /v1/resources/:kind[/:name][?with_secrets=1]
 *                                              DELETE /v1/resources/:kind/:name
 *                                              POST   /v1/locks            DELETE /v1/locks[/:name][?user=|role=|node=]
 *                                              GET    /v1/autoupdate/instruction?host_id=&group=  (a Proxy)
 *                                              GET    /v1/autoupdate/status
 *                                              POST   /v1/autoupdate/{start,suspend,resume,mark-done,rollback}
 *
 * Every authenticated request is made by the caller as it stands now (AuthService.resolveCaller): a removed
 * user or agent, or a locked one, is refused whatever its certificate says, and only the roles the user still
 * has count. The caller is the client certificate when one is presented, else the web session of the browser
 * (the `__Host-gw_session` cookie and, on every request, `Authorization: Bearer` of that same session:
 * websessions.ts), resolved the same way. A state-changing request whose Origin header is present and is not the
 * page's own origin is refused (GW_ERR_WEB_CSRF); no CORS header is ever sent.
 *
 * The Auth API on 3025 requires a client certificate for everything but the public routes; the Proxy's web
 * port serves the same router (its TLS asks for, but does not require, a client certificate). Errors are
 * {"error": {"code", "message", "hint"}} with the code's HTTP status (src/errors.ts).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { isIP } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { GatewayError, httpStatus, toGatewayError, type ErrorCode } from '../errors.js';
import { logger } from '../log.js';
import { readBoundedBody } from '../net/http.js';
import { clientAddress } from '../stream/meta.js';
import { FORWARDED } from '../wire/forwarded.js';
import { caPin, type Identity } from './pki.js';
import { forwardedIdentity, peerIdentity } from './peeridentity.js';
import { jsonDepth, yamlNestingBound } from './bounds.js';
import { agentRoutes } from './agentapi.js';
import { clusterStatus } from './drift.js';
import type { Verb } from './rbac.js';
import { DEFAULT_APPLY_SET, MAX_APPLY_BYTES, MAX_APPLY_FILES, parseManifest, parseManifestFiles, RESOURCE_KINDS, type LockTarget } from './resources/index.js';
import { proxyRoutes, requireProxy, STREAMED } from './proxyapi.js';
import { ROLLOUT_COMMANDS, type RolloutCommand } from './rollout/commands.js';
import { AUTOUPDATE_AUTH_INSTRUCTION_PATH, AUTOUPDATE_STATUS_PATH } from '../wire/autoupdate.js';
import { parseInstructionQuery } from '../wire/autoupdatequery.js';
import { JOIN_ROLES, type AuthService, type JoinRole } from './service.js';
import { SAML_ACS_PATH, ssoRoutes } from './ssoapi.js';
import { bearerOf, clearedCookie, cookieValue, originRefusal, WEB_SESSION_COOKIE, type WebSessionView } from './websessions.js';

/** Request body limits (bytes): a manifest may be large; everything else is a few fields. */
const BODY = { manifest: 1024 * 1024, credentials: 64 * 1024, small: 16 * 1024 } as const;
/** How deeply a JSON body, and a YAML manifest (an over-counting bound: bounds.ts), may nest. */
const MAX_JSON_DEPTH = 32;
const MAX_YAML_NESTING = 96;

type Handler = (ctx: Ctx) => Promise<unknown>;

interface Ctx {
  req: IncomingMessage;
  res: ServerResponse;
  params: Record<string, string>;
  query: URLSearchParams;
  body: () => Promise<Record<string, unknown>>;
  /** The caller as it stands now (resolveCaller): certificate, then stored user or agent, then locks. */
  caller: () => Promise<Identity>;
  /** The client's address: the socket's, or the one a Proxy forwarded (FORWARDED). */
  source: string;
  /** The browser's web session credentials, as sent (unchecked). */
  web: WebCredentials;
  /** Adds a header to the answer (Set-Cookie). */
  setHeader: (name: string, value: string) => void;
}

/** The web session cookie and the bearer of a request, as sent. */
interface WebCredentials {
  id?: string;
  bearer?: string;
}

function webCredentials(req: IncomingMessage): WebCredentials {
  const id = cookieValue(req.headers.cookie, WEB_SESSION_COOKIE);
  const bearer = bearerOf(req.headers.authorization);
  return { ...(id === undefined ? {} : { id }), ...(bearer === undefined ? {} : { bearer }) };
}

/**
 * What a route's body may be, and the check that runs before it is read: an authenticated route resolves its
 * caller first (a removed or locked identity is refused before a byte of the body is parsed), then `before`
 * (the role check for what the body would ask), and only then reads at most maxBody bytes.
 */
interface BodyRule {
  maxBody: number;
  before?: (auth: AuthService, caller: Identity) => Promise<void>;
}

interface Route {
  method: string;
  pattern: RegExp;
  keys: string[];
  handler: Handler;
  body: BodyRule;
  /** Every route but the public /webapi/ ones needs a client certificate. */
  authenticated: boolean;
}

function route(method: string, path: string, handler: Handler, body: BodyRule = { maxBody: BODY.small }): Route {
  const keys: string[] = [];
  const pattern = new RegExp(
    `^${path.replace(/:([a-z_]+)\*?/g, (m, key: string) => {
      keys.push(key);
      return m.endsWith('*') ? '(.+)' : '([^/]+)';
    })}$`,
  );
  return { method, pattern, keys, handler, body, authenticated: !path.startsWith('/webapi/') };
}

const may = (resource: string, verb: Verb): BodyRule['before'] => (auth, caller) => auth.authorize(caller, resource, verb);

function bad(message: string): GatewayError {
  return new GatewayError('GW_ERR_API_BAD_REQUEST', message);
}

function str(body: Record<string, unknown>, key: string, options: { optional?: boolean; max?: number } = {}): string {
  const v = body[key];
  if (v === undefined && options.optional) return '';
  if (typeof v !== 'string') throw bad(`"${key}" must be a string`);
  if (v.length > (options.max ?? 16_384)) throw bad(`"${key}" is too long`);
  return v;
}

/** The files of POST /v1/resources/apply, within MAX_APPLY_FILES and MAX_APPLY_BYTES, each nesting within bounds. */
function applyFiles(b: Record<string, unknown>): Array<{ source: string; manifest: string }> {
  const files = b.files;
  if (!Array.isArray(files) || files.length === 0) throw bad('"files" must be a non-empty list of { source, manifest }');
  if (files.length > MAX_APPLY_FILES) throw new GatewayError('GW_ERR_APPLY_TOO_LARGE', `${files.length} files; one apply takes at most ${MAX_APPLY_FILES}`);
  let total = 0;
  return files.map((f: unknown) => {
    if (typeof f !== 'object' || f === null) throw bad('each of "files" must be { source, manifest }');
    const file = f as Record<string, unknown>;
    const manifest = str(file, 'manifest', { max: MAX_APPLY_BYTES });
    total += manifest.length;
    if (total > MAX_APPLY_BYTES) throw new GatewayError('GW_ERR_APPLY_TOO_LARGE', `the files hold more than ${MAX_APPLY_BYTES} characters together`);
    if (yamlNestingBound(manifest, MAX_YAML_NESTING) > MAX_YAML_NESTING) throw bad(`a manifest nests deeper than ${MAX_YAML_NESTING} levels (indentation included)`);
    return { source: str(file, 'source', { optional: true, max: 1024 }) || 'manifest', manifest };
  });
}

function strList(body: Record<string, unknown>, key: string): string[] {
  const v = body[key];
  if (!Array.isArray(v) || !v.every((x) => typeof x === 'string')) throw bad(`"${key}" must be a list of strings`);
  return v as string[];
}

function joinRoles(body: Record<string, unknown>, key: string): JoinRole[] {
  const roles = strList(body, key);
  for (const r of roles) if (!JOIN_ROLES.includes(r as JoinRole)) throw bad(`"${r}" is not a service type (${JOIN_ROLES.join(', ')})`);
  return roles as JoinRole[];
}

/** The body of POST /v1/locks: {target: {user | role | node}, message?, ttl_ms? | expires?, name?}. */
function lockRequest(b: Record<string, unknown>): { target: LockTarget; message?: string; ttlMs?: number; expiresAt?: number; name?: string } {
  const t = b.target;
  if (t === null || typeof t !== 'object' || Array.isArray(t)) throw bad('"target" must be an object with one of user, role, node');
  const target = t as Record<string, unknown>;
  for (const [k, v] of Object.entries(target)) {
    if (!['user', 'role', 'node'].includes(k) || typeof v !== 'string') throw bad(`"target.${k}" is not user, role or node with a string value`);
  }
  const ttl = b.ttl_ms;
  if (ttl !== undefined && (typeof ttl !== 'number' || !(ttl > 0))) throw bad('"ttl_ms" must be a positive number');
  if (ttl !== undefined && b.expires !== undefined) throw bad('give "ttl_ms" or "expires", not both');
  const expires = b.expires === undefined ? undefined : Date.parse(str(b, 'expires', { max: 64 }));
  if (expires !== undefined && Number.isNaN(expires)) throw bad('"expires" must be an RFC 3339 time such as 2030-01-31T23:59:59Z');
  const message = str(b, 'message', { optional: true, max: 1024 });
  const name = str(b, 'name', { optional: true, max: 128 });
  return {
    target: target as LockTarget,
    ...(message ? { message } : {}),
    ...(typeof ttl === 'number' ? { ttlMs: ttl } : {}),
    ...(expires === undefined ? {} : { expiresAt: expires }),
    ...(name ? { name } : {}),
  };
}

async function readBody(req: IncomingMessage, maxBody: number): Promise<Record<string, unknown>> {
  const body = await readBoundedBody(req, maxBody);
  if (body.length === 0) return {};
  const text = body.toString('utf8');
  if (jsonDepth(text, MAX_JSON_DEPTH) > MAX_JSON_DEPTH) throw bad(`the request body nests deeper than ${MAX_JSON_DEPTH} levels`);
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw bad('the request body is not valid JSON');
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw bad('the request body must be a JSON object');
  return parsed as Record<string, unknown>;
}

/** Public: the CA, joining and logging in (no client certificate needed). */
function publicRoutes(auth: AuthService): Route[] {
  return [
    route('GET', '/webapi/ca', async () => auth.publicCas()),
    route('POST', '/webapi/join', async ({ body, source }) => {
      const b = await body();
      const bundle = await auth.join({
        token: str(b, 'token', { max: 512 }),
        roles: joinRoles(b, 'roles'),
        nodename: str(b, 'nodename', { max: 256 }),
        publicAddrs: b.public_addrs === undefined ? [] : strList(b, 'public_addrs'),
        publicKeyPem: str(b, 'public_key'),
        sshPublicKey: str(b, 'ssh_public_key'),
        source,
      });
      return bundle;
    }, { maxBody: BODY.credentials }),
    route('POST', '/webapi/login', async ({ body, source }) => {
      const b = await body();
      const ttl = b.ttl_ms;
      if (ttl !== undefined && (typeof ttl !== 'number' || !(ttl > 0))) throw bad('"ttl_ms" must be a positive number');
      const bundle = await auth.login({
        username: str(b, 'username', { max: 256 }),
        password: str(b, 'password', { max: 4096 }),
        publicKeyPem: str(b, 'public_key'),
        sshPublicKey: str(b, 'ssh_public_key'),
        ...(typeof ttl === 'number' ? { ttlMs: ttl } : {}),
        source,
      });
      return bundle;
    }, { maxBody: BODY.credentials }),
  ];
}

/** The caller's status and inventory, users and join tokens. */
function identityRoutes(auth: AuthService): Route[] {
  return [
    route('GET', '/v1/status', async ({ caller }) => clusterStatus(auth, await caller())),
    route('GET', '/v1/agent/maintenance', async ({ caller }) => ({ config: (await auth.maintenanceForAgent(await caller())) ?? null })),
    route('GET', '/v1/inventory/:kind', async ({ caller, params }) => ({ items: await auth.inventory(await caller(), params.kind!) })),
    route('GET', '/v1/users', async ({ caller }) => ({ users: await auth.listUsers(await caller()) })),
    route('POST', '/v1/users', async ({ caller, body }) => {
      const b = await body();
      const traitList = (key: 'db_users' | 'db_names' | 'kubernetes_users' | 'kubernetes_groups') => (b[key] === undefined ? {} : { [key]: strList(b, key) });
      const dbTraits = { ...traitList('db_users'), ...traitList('db_names'), ...traitList('kubernetes_users'), ...traitList('kubernetes_groups') };
      return { user: await auth.addUser(await caller(), str(b, 'name', { max: 256 }), strList(b, 'roles'), str(b, 'password', { max: 4096 }), b.logins === undefined ? [] : strList(b, 'logins'), dbTraits) };
    }, { maxBody: BODY.small, before: may('user', 'create') }),
    route('PUT', '/v1/users/:name/roles', async ({ caller, body, params }) => ({
      user: await auth.setUserRoles(await caller(), params.name!, strList(await body(), 'roles')),
    }), { maxBody: BODY.small, before: may('user', 'update') }),
    route('DELETE', '/v1/users/:name', async ({ caller, params }) => {
      await auth.removeUser(await caller(), params.name!);
      return { removed: params.name };
    }),
    route('GET', '/v1/tokens', async ({ caller }) => ({ tokens: await auth.listTokens(await caller()) })),
    route('POST', '/v1/tokens', async ({ caller, body }) => {
      const b = await body();
      const ttl = b.ttl_ms;
      const uses = b.uses;
      if (ttl !== undefined && typeof ttl !== 'number') throw bad('"ttl_ms" must be a number');
      if (uses !== undefined && (typeof uses !== 'number' || !Number.isInteger(uses) || uses < 0)) throw bad('"uses" must be a whole number, 0 for unlimited');
      const created = await auth.addToken(await caller(), {
        roles: joinRoles(b, 'roles'),
        ...(typeof ttl === 'number' ? { ttlMs: ttl } : {}),
        ...(typeof uses === 'number' ? { uses } : {}),
      });
      // The pin the joining agent checks the cluster against: the Web UI prints the whole command line with it.
      return { ...created, ca_pin: caPin(auth.host.tls.certPem) };
    }, { maxBody: BODY.small, before: may('token', 'create') }),
    route('DELETE', '/v1/tokens/:id', async ({ caller, params }) => {
      await auth.removeToken(await caller(), params.id!);
      return { removed: true };
    }),
  ];
}

/** The managed rollout (src/auth/rollout/): a Proxy asks for its upgraders, users read and steer it. */
function autoupdateRoutes(auth: AuthService): Route[] {
  return [
    route('GET', AUTOUPDATE_AUTH_INSTRUCTION_PATH, async ({ caller, req }) => {
      requireProxy(await caller());
      const q = parseInstructionQuery((req.url ?? '').split('?')[1] ?? '');
      return auth.autoupdateInstruction(q.hostId, q.group);
    }),
    // A Proxy asks for the Web UI's rollout panel after checking its user's rule (src/proxy/web.ts); anyone else is
    // checked here for reading autoupdate_agent_rollout.
    route('GET', AUTOUPDATE_STATUS_PATH, async ({ caller }) => {
      const c = await caller();
      return auth.autoupdateStatus(c.kind === 'host' && c.roles.includes('proxy') ? undefined : c);
    }),
    route('POST', '/v1/autoupdate/:command', async ({ caller, body, params }) => {
      const command = params.command as RolloutCommand;
      if (!(ROLLOUT_COMMANDS as readonly string[]).includes(command)) throw bad(`unknown rollout command; one of ${ROLLOUT_COMMANDS.join(', ')}`);
      const b = await body();
      const group = str(b, 'group', { optional: true, max: 64 });
      if (b.now !== undefined && typeof b.now !== 'boolean') throw bad('"now" must be true or false');
      return auth.autoupdateCommand(await caller(), { command, ...(group ? { group } : {}), ...(b.now === true ? { now: true } : {}) });
    }, { maxBody: BODY.small, before: (auth, caller) => auth.authorizeAny(caller, ['autoupdate_version', 'autoupdate_agent_rollout'], ['update']) }),
  ];
}

/** Resources from manifests, and locks. */
function resourceRoutes(auth: AuthService): Route[] {
  return [
    route('POST', '/v1/resources', async ({ caller, body }) => {
      const b = await body();
      const who = await caller();
      const manifest = str(b, 'manifest', { max: BODY.manifest });
      if (yamlNestingBound(manifest, MAX_YAML_NESTING) > MAX_YAML_NESTING) throw bad(`the manifest nests deeper than ${MAX_YAML_NESTING} levels (indentation included)`);
      const resources = parseManifest(manifest, str(b, 'source', { optional: true, max: 1024 }) || 'manifest');
      if (resources.length === 0) throw new GatewayError('GW_ERR_RESOURCE_INVALID', 'the manifest holds no resource');
      return { messages: await auth.createResources(who, resources, b.overwrite === true) };
    }, { maxBody: BODY.manifest + 4096, before: (auth, caller) => auth.authorizeAny(caller, RESOURCE_KINDS, ['create', 'update']) }),
    route('POST', '/v1/resources/apply', async ({ caller, body }) => {
      const b = await body();
      const who = await caller();
      const resources = parseManifestFiles(applyFiles(b));
      const options = { dryRun: b.dry_run === true, prune: b.prune === true, set: str(b, 'set', { optional: true, max: 64 }) || DEFAULT_APPLY_SET };
      return auth.applyResources(who, resources, options);
    }, { maxBody: 2 * MAX_APPLY_BYTES + 64 * 1024, before: (auth, caller) => auth.authorizeAny(caller, RESOURCE_KINDS, ['create', 'update']) }),
    route('GET', '/v1/resources/:kind', async ({ caller, params, query }) => ({
      resources: await auth.getResources(await caller(), params.kind!, undefined, query.get('with_secrets') === '1'),
    })),
    route('GET', '/v1/resources/:kind/:name*', async ({ caller, params, query }) => ({
      resources: await auth.getResources(await caller(), params.kind!, params.name!, query.get('with_secrets') === '1'),
    })),
    route('POST', '/v1/locks', async ({ caller, body }) => {
      const b = await body();
      const who = await caller();
      return { lock: await auth.createLock(who, lockRequest(b)) };
    }, { maxBody: BODY.small, before: may('lock', 'create') }),
    route('DELETE', '/v1/locks', async ({ caller, query }) => {
      const target = Object.fromEntries(['user', 'role', 'node'].filter((k) => query.has(k)).map((k) => [k, query.get(k)!]));
      return { removed: await auth.removeLocks(await caller(), { target }) };
    }),
    route('DELETE', '/v1/locks/:name', async ({ caller, params }) => ({ removed: await auth.removeLocks(await caller(), { name: params.name! }) })),
    route('DELETE', '/v1/resources/:kind/:name*', async ({ caller, params }) => {
      await auth.removeResource(await caller(), params.kind!, params.name!);
      return { removed: `${params.kind}/${params.name}` };
    }),
  ];
}

const MAX_FORWARDED_CERT = 16 * 1024;

/** Where a request comes from: its own socket, or, through a Proxy, the client the Proxy forwarded. */
interface Origin {
  source: string;
  /** Through a Proxy: the client's certificate (DER), or null when it presented none. */
  forwarded?: Buffer | null;
  /** The host the client addressed (Host, or HTTP/2's :authority; through a Proxy, the one it forwarded). */
  host?: string;
}

function hostHeader(value: string | string[] | undefined): string | undefined {
  return typeof value === 'string' && value.length > 0 && value.length <= 1024 ? value : undefined;
}

async function originOf(auth: AuthService, req: IncomingMessage): Promise<Origin> {
  const addressed = hostHeader(req.headers.host) ?? hostHeader(req.headers[':authority']);
  const own: Origin = { source: clientAddress(req.socket).address, ...(addressed ? { host: addressed } : {}) };
  if (req.headers[FORWARDED.marker] === undefined) return own;
  let certified: Identity;
  try {
    certified = peerIdentity(auth, req);
  } catch {
    return own; // No certificate of this cluster: the headers mean nothing, the request is anonymous.
  }
  // Not a Proxy's certificate: the headers mean nothing (the caller is whoever its own certificate names).
  if (certified.kind !== 'host' || !certified.roles.includes('proxy')) return own;
  // A Proxy's certificate: from here on, fail closed. Were a failed check (a backend hiccup) to fall back to the
  // socket's identity, an anonymous client forwarded by this Proxy would act as the Proxy itself.
  const proxy = await auth.resolveCaller(certified);
  requireProxy(proxy);
  const addr = req.headers[FORWARDED.addr];
  const source = typeof addr === 'string' && isIP(addr) ? addr : `unknown-via-${proxy.name}`;
  const forwardedHost = hostHeader(req.headers[FORWARDED.host]);
  const host = forwardedHost ? { host: forwardedHost } : {};
  const cert = req.headers[FORWARDED.cert];
  if (typeof cert !== 'string' || cert.length === 0) return { source, forwarded: null, ...host };
  if (cert.length > MAX_FORWARDED_CERT) throw bad('the forwarded client certificate is too large');
  return { source, forwarded: Buffer.from(cert, 'base64'), ...host };
}

const STATE_CHANGING: ReadonlySet<string> = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);

/**
 * Routes that other sites POST to by design, so their Origin is never ours: the SAML ACS (the identity provider's
 * HTTP-POST binding form). It uses no session cookie; RelayState, the browser-binding cookie and InResponseTo
 * tie the answer to the sign-in this browser started.
 */
const CROSS_SITE_POSTS: ReadonlySet<string> = new Set([SAML_ACS_PATH]);

/**
 * GW_ERR_WEB_CSRF for a state-changing request whose Origin header is present and is not the origin of the host
 * it addressed (https only). Without an Origin header (gwsh, gwctl, agents) nothing is checked here: the cookie
 * is SameSite=Strict and every cookie-authenticated request needs the session's bearer as well.
 */
function checkOrigin(req: IncomingMessage, origin: Origin): void {
  if (!STATE_CHANGING.has(req.method ?? '')) return;
  const refusal = originRefusal(req.headers.origin, origin.host, req.method);
  if (refusal) throw refusal;
}

/** Whether the client presented a certificate (valid or not): then it, not a web session, names the caller. */
function certificatePresented(req: IncomingMessage, origin: Origin): boolean {
  if (origin.forwarded !== undefined) return origin.forwarded !== null;
  const socket = req.socket as TLSSocket;
  return typeof socket.getPeerCertificate === 'function' && Boolean(socket.getPeerCertificate()?.raw);
}

function callerOf(auth: AuthService, req: IncomingMessage, origin: Origin, web: WebCredentials): Promise<Identity> {
  if (!certificatePresented(req, origin) && (web.id !== undefined || web.bearer !== undefined)) {
    return auth.resolveWebSession(web.id ?? '', web.bearer).then((view) => view.identity);
  }
  if (origin.forwarded === undefined) return (async () => auth.resolveCaller(peerIdentity(auth, req)))();
  if (origin.forwarded === null) {
    return Promise.reject(new GatewayError('GW_ERR_AUTH_UNAUTHENTICATED', 'no valid client certificate from this cluster: none was presented to the Proxy', {
      hint: "Sign in with 'gwsh login', or on the Auth Service's machine run gwctl with access to its data directory.",
    }));
  }
  const der = origin.forwarded;
  return (async () => auth.resolveCaller(forwardedIdentity(auth, der)))();
}

/** The user a page shows: name, roles and logins as they stand now. */
function userView(identity: Identity): { name: string; roles: string[]; logins: string[] } {
  return { name: identity.name, roles: identity.roles, logins: identity.logins ?? [] };
}

function sessionAnswer(view: Pick<WebSessionView, 'identity' | 'expiresAt' | 'connector'>): Record<string, unknown> {
  return { user: userView(view.identity), expires_at: new Date(view.expiresAt).toISOString(), ...(view.connector ? { connector: view.connector } : {}) };
}

/** Largest page of GET /v1/events. */
const MAX_EVENTS = 500;

/** The browser's sessions (websessions.ts) and the audit log for the page. */
function webRoutes(auth: AuthService): Route[] {
  return [
    route('POST', '/webapi/sessions', async ({ body, source, setHeader }) => {
      const b = await body();
      const session = await auth.webLogin(str(b, 'user', { max: 256 }), str(b, 'password', { max: 4096 }), source);
      setHeader('set-cookie', session.cookie);
      return { token: session.bearer, ...sessionAnswer(session) };
    }, { maxBody: BODY.credentials }),
    route('GET', '/webapi/sessions/current', async ({ web }) => {
      const view = await auth.resolveWebSession(web.id ?? '', web.bearer);
      // The connector as the sign-in page named it (its display), when it still exists.
      const display = view.connector ? (await auth.sso.connectors()).connectors.find((c) => c.kind === view.connector!.kind && c.name === view.connector!.name)?.display : undefined;
      const answer = sessionAnswer(view);
      if (display !== undefined && view.connector) answer.connector = { ...view.connector, display };
      return { ...answer, acl: await auth.webAcl(view.identity) };
    }),
    route('DELETE', '/webapi/sessions', async ({ web, setHeader }) => {
      await auth.deleteWebSession(web.id, web.bearer);
      setHeader('set-cookie', clearedCookie());
      return { ok: true };
    }),
    // After an SSO redirect the page has the cookie and no bearer: it gets it here, once (the cookie is
    // SameSite=Strict and the Origin must be this page's: checkOrigin, and required here).
    route('POST', '/webapi/sessions/bearer', async ({ req, web }) => {
      if (req.headers.origin === undefined) throw new GatewayError('GW_ERR_WEB_CSRF', 'the bearer handout needs the Origin header of the page', { hint: 'Only the web page itself, from its own origin, may ask for its bearer token.' });
      const { view, bearer } = await auth.handoutWebBearer(web.id);
      return { token: bearer, ...sessionAnswer(view) };
    }),
    route('GET', '/v1/events', async ({ caller, query }) => {
      const given = query.get('limit');
      const limit = given === null ? 100 : Number(given);
      if (!Number.isInteger(limit) || limit < 1 || limit > MAX_EVENTS) throw bad(`"limit" must be a whole number from 1 to ${MAX_EVENTS}`);
      return { events: await auth.listEvents(await caller(), limit) };
    }),
  ];
}

/** The /v1/proxy/ routes (proxyapi.ts) as routes of this router: the caller must be a Proxy before anything else. */
function proxyApiRoutes(auth: AuthService, keepAliveMs: number): Route[] {
  return proxyRoutes(auth, { keepAliveMs }).map((r) =>
    route(r.method, r.path, async (ctx) => {
      const proxy = await ctx.caller();
      requireProxy(proxy);
      return r.handle({ proxy, params: ctx.params, query: ctx.query, body: ctx.body, req: ctx.req, res: ctx.res });
    }, { maxBody: r.maxBody, before: async (_auth, caller) => requireProxy(caller) }),
  );
}

export interface ApiOptions {
  /** Keep-alive interval of the Proxies' event streams: well under the listener's idle timeout. */
  streamKeepAliveMs?: number;
}

export function createApiHandler(auth: AuthService, options: ApiOptions = {}): (req: IncomingMessage, res: ServerResponse) => void {
  const log = logger('api');
  const routes: Route[] = [
    ...publicRoutes(auth),
    ...identityRoutes(auth),
    ...resourceRoutes(auth),
    ...autoupdateRoutes(auth),
    ...agentRoutes(auth).map((r) => route(r.method, r.path, r.handler, { maxBody: r.maxBody })),
    ...ssoRoutes(auth).map((r) => route(r.method, r.path, r.handler, { maxBody: r.maxBody })),
    ...proxyApiRoutes(auth, options.streamKeepAliveMs ?? 5000),
    ...webRoutes(auth),
  ];

  return (req, res) => {
    const url = new URL(req.url ?? '/', 'https://gateway.invalid');
    const extra: Record<string, string> = {};
    const send = (status: number, payload: unknown) => {
      if (res.headersSent) {
        res.destroy();
        return;
      }
      const text = JSON.stringify(payload);
      const headers = status < 400 ? extra : {};
      res.writeHead(status, { ...headers, 'content-type': 'application/json', 'cache-control': 'no-store', 'content-length': Buffer.byteLength(text) });
      res.end(text);
    };
    const pathMatches = routes.filter((r) => r.pattern.test(url.pathname));
    const chosen = pathMatches.find((r) => r.method === req.method);
    if (!chosen) {
      const code: ErrorCode = pathMatches.length === 0 ? 'GW_ERR_API_NOT_FOUND' : 'GW_ERR_API_METHOD_NOT_ALLOWED';
      const message = pathMatches.length === 0 ? `no such endpoint: ${url.pathname}` : `${req.method} is not allowed on ${url.pathname}`;
      send(httpStatus(code), { error: { code, message, hint: 'Check that the client and the server run the same version.' } });
      return;
    }
    const found = chosen.pattern.exec(url.pathname)!;
    const params: Record<string, string> = {};
    try {
      chosen.keys.forEach((k, i) => (params[k] = decodeURIComponent(found[i + 1]!)));
    } catch {
      const e = bad('the request path has a bad percent-encoding');
      send(httpStatus(e.code), { error: e.toJSON() });
      return;
    }
    const fail = (err: unknown) => {
      const e = toGatewayError(err);
      const status = httpStatus(e.code);
      if (status >= 500) log.error({ err: e, path: url.pathname }, 'request failed');
      else log.debug({ code: e.code, path: url.pathname }, 'request refused');
      send(status, { error: e.toJSON() });
    };
    originOf(auth, req)
      .then((origin) => {
        if (!CROSS_SITE_POSTS.has(url.pathname)) checkOrigin(req, origin);
        const web = webCredentials(req);
        let identity: Promise<Identity> | undefined;
        const ctx: Ctx = {
          req,
          res,
          params,
          query: url.searchParams,
          body: async () => {
            if (chosen.authenticated) {
              const who = await ctx.caller();
              await chosen.body.before?.(auth, who);
            }
            return readBody(req, chosen.body.maxBody);
          },
          caller: () => (identity ??= callerOf(auth, req, origin, web)),
          source: origin.source,
          web,
          setHeader: (name, value) => void (extra[name.toLowerCase()] = value),
        };
        return chosen.handler(ctx);
      })
      .then((result) => {
        if (result !== STREAMED) send(200, result);
      })
      .catch(fail);
  };
}
