/**
 * src/auth/api.ts at module level: the router is called with in-memory requests and responses, an AuthService
 * on an in-memory Backend, and TLS peers faked from real certificates of that cluster (the socket says what a
 * TLS handshake would have said). A log records, in order, the service calls the router makes and the moment
 * it first pulls the request body, so "who asks is checked before what is asked is read" is visible.
 */
import { X509Certificate } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createApiHandler } from '../../src/auth/api.js';
import { generateKeyPair } from '../../src/auth/pki.js';
import { AuthService } from '../../src/auth/service.js';
import { openSqliteBackend } from '../../src/backend/index.js';
import { httpStatus, type ErrorCode } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';

const PASSWORD = 'correct horse battery';
const keys = generateKeyPair();

/** What the TLS layer hands the router: the peer certificate (DER), its issuer, and whether it verified. */
interface FakePeer {
  raw: Buffer;
  valid_from: string;
  issuerCertificate: { raw: Buffer };
  authorized: boolean;
}

function peerOf(certPem: string, issuerPem: string, authorized = true): FakePeer {
  const cert = new X509Certificate(certPem);
  return { raw: cert.raw, valid_from: cert.validFrom, issuerCertificate: { raw: new X509Certificate(issuerPem).raw }, authorized };
}

interface Answer {
  status: number;
  headers: Record<string, string | number>;
  body: { error?: { code: string; message: string; hint: string } } & Record<string, unknown>;
}

interface Request {
  method: string;
  path: string;
  /** A TLS peer; undefined: a connection with no TLS at all. */
  peer?: FakePeer | 'no certificate';
  body?: string | Buffer;
  /** false: the body stream never ends (a client that keeps it open). */
  end?: boolean;
  headers?: Record<string, string>;
}

let backend: ReturnType<typeof openSqliteBackend>;
let auth: AuthService;
/** Service calls and body reads, in order. */
let calls: string[];
/** Service methods replaced for one test. */
let overrides: Record<string, (...args: unknown[]) => unknown>;
let handler: (req: IncomingMessage, res: ServerResponse) => void;
let admin: FakePeer;
let alice: FakePeer;

const LOGGED = new Set(['resolveCaller', 'authorize', 'authorizeAny', 'addUser', 'removeUser', 'login', 'createResources', 'publicCas', 'status']);

/** The service as the router sees it: every call in LOGGED is logged; overrides replace methods. */
function observed(service: AuthService): AuthService {
  return new Proxy(service, {
    get(target, prop, receiver) {
      const name = String(prop);
      const value = overrides[name] ?? Reflect.get(target, prop, receiver);
      if (typeof value !== 'function') return value;
      return (...args: unknown[]) => {
        if (LOGGED.has(name)) calls.push(name);
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
}

function send(request: Request): Promise<Answer> {
  const chunks = request.body === undefined ? [] : [Buffer.from(request.body)];
  let pulled = false;
  const stream = new Readable({
    read() {
      if (pulled) return;
      pulled = true;
      calls.push('body read');
      for (const c of chunks) this.push(c);
      if (request.end !== false) this.push(null);
    },
  });
  const peer = request.peer;
  const socket =
    peer === undefined
      ? { remoteAddress: '192.0.2.7', remotePort: 40000 }
      : {
          remoteAddress: '192.0.2.7',
          remotePort: 40000,
          authorized: peer !== 'no certificate' && peer.authorized,
          authorizationError: peer === 'no certificate' ? undefined : 'CERT_SIGNATURE_FAILURE',
          getPeerCertificate: () => (peer === 'no certificate' ? {} : peer),
        };
  const req = Object.assign(stream, { method: request.method, url: request.path, headers: request.headers ?? {}, socket }) as unknown as IncomingMessage;
  return new Promise((resolve) => {
    let status = 0;
    let headers: Answer['headers'] = {};
    const res = {
      writeHead(s: number, h: Answer['headers']) {
        status = s;
        headers = h;
        return res;
      },
      end(text: string) {
        resolve({ status, headers, body: JSON.parse(text) as Answer['body'] });
      },
    } as unknown as ServerResponse;
    handler(req, res);
  });
}

/** The one error shape: {"error": {"code", "message", "hint"}}, with the status chosen from the code. */
function expectError(answer: Answer, status: number, code: ErrorCode, message?: RegExp): void {
  expect(answer.status).toBe(status);
  expect(Object.keys(answer.body)).toEqual(['error']);
  const error = answer.body.error!;
  expect(Object.keys(error).sort()).toEqual(['code', 'hint', 'message']);
  expect(error.code).toBe(code);
  expect(typeof error.message).toBe('string');
  expect(error.hint).toMatch(/\S/);
  if (message) expect(error.message).toMatch(message);
}

async function loginCert(username: string): Promise<FakePeer> {
  const bundle = await auth.login({ username, password: PASSWORD, publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source: '192.0.2.1' });
  return peerOf(bundle.tlsCert, auth.user.tls.certPem);
}

beforeAll(() => setRootLogger(createLogger({ level: 'silent' })));

/** The Auth API's statuses as they were when the router had a table of its own (now the registry's: src/errors.ts). */
const STATUS_OF: ReadonlyArray<readonly [ErrorCode, number]> = [
  ['GW_ERR_API_BAD_REQUEST', 400],
  ['GW_ERR_API_METHOD_NOT_ALLOWED', 405],
  ['GW_ERR_API_BAD_KEY', 400],
  ['GW_ERR_RESOURCE_INVALID', 400],
  ['GW_ERR_RESOURCE_KIND', 400],
  ['GW_ERR_AUTH_WEAK_PASSWORD', 400],
  ['GW_ERR_AUTH_UNAUTHENTICATED', 401],
  ['GW_ERR_AUTH_IDENTITY_REVOKED', 401],
  ['GW_ERR_AUTH_LOGIN_FAILED', 401],
  ['GW_ERR_AUTH_TOKEN_UNKNOWN', 401],
  ['GW_ERR_AUTH_TOKEN_EXPIRED', 401],
  ['GW_ERR_AUTH_TOKEN_USED', 401],
  ['GW_ERR_HOST_RENEW_REFUSED', 403],
  ['GW_ERR_HOST_RENEW_TOO_SOON', 429],
  ['GW_ERR_AUTH_TOKEN_WRONG_TYPE', 403],
  ['GW_ERR_AUTH_JOIN_NAME_RESERVED', 403],
  ['GW_ERR_ACCESS_DENIED', 403],
  ['GW_ERR_ACCESS_LOCKED', 403],
  ['GW_ERR_API_NOT_FOUND', 404],
  ['GW_ERR_RESOURCE_NOT_FOUND', 404],
  ['GW_ERR_RESOURCE_EXISTS', 409],
  ['GW_ERR_API_TOO_LARGE', 413],
  ['GW_ERR_AUTH_RATE_LIMITED', 429],
  ['GW_ERR_AUDIT_RATE_LIMITED', 429],
  ['GW_ERR_DIRECT_ADDR_REFUSED', 403],
  ['GW_ERR_DIRECT_FORWARDED', 403],
  ['GW_ERR_DIRECT_CLOCK', 400],
  ['GW_ERR_MEMBER_PRESENCE_REFUSED', 403],
  ['GW_ERR_MEMBER_EVENT_REFUSED', 403],
  ['GW_ERR_API_TOO_MANY_STREAMS', 429],
  ['GW_ERR_AUTH_UNREACHABLE', 503],
  ['GW_ERR_WEB_SESSION_MISSING', 401],
  ['GW_ERR_WEB_SESSION_EXPIRED', 401],
  ['GW_ERR_WEB_SESSION_INVALID', 401],
  ['GW_ERR_WEB_CSRF', 403],
  ['GW_ERR_SSO_CONNECTOR_UNKNOWN', 404],
  ['GW_ERR_SSO_STATE_INVALID', 400],
  ['GW_ERR_SSO_TOKEN_INVALID', 401],
  ['GW_ERR_SSO_IDP_ERROR', 502],
  ['GW_ERR_SSO_NO_ROLES', 403],
  ['GW_ERR_SSO_USERNAME_REFUSED', 403],
  ['GW_ERR_WEB_APP_LAUNCH_UNBOUND', 403],
];

describe('the status of a code (the registry)', () => {
  it.each(STATUS_OF)('%s is %i', (code, status) => {
    expect(httpStatus(code)).toBe(status);
  });
});

describe('the router', () => {
  beforeEach(async () => {
    backend = openSqliteBackend({ path: ':memory:', sweepIntervalMs: 0 });
    auth = await AuthService.open({ backend, clusterName: 'api.example' });
    calls = [];
    overrides = {};
    handler = createApiHandler(observed(auth));
    admin = peerOf(await auth.issueAdminCert(keys.publicKeyPem), auth.user.tls.certPem);
    await auth.addUser(auth.adminIdentity(), 'alice', ['access'], PASSWORD);
    alice = await loginCert('alice');
  });

  afterEach(async () => {
    await backend.close();
  });

  describe('routing', () => {
    it('an unknown path is 404 GW_ERR_API_NOT_FOUND, naming the path', async () => {
      expectError(await send({ method: 'GET', path: '/v1/nothing-here' }), 404, 'GW_ERR_API_NOT_FOUND', /no such endpoint: \/v1\/nothing-here/);
      expect(calls).toEqual([]);
    });

    it('a known path with another method is 405 GW_ERR_API_METHOD_NOT_ALLOWED, naming the method', async () => {
      expectError(await send({ method: 'DELETE', path: '/webapi/ca' }), 405, 'GW_ERR_API_METHOD_NOT_ALLOWED', /DELETE is not allowed on \/webapi\/ca/);
      expectError(await send({ method: 'PUT', path: '/v1/users', peer: admin }), 405, 'GW_ERR_API_METHOD_NOT_ALLOWED');
      expect(calls).toEqual([]);
    });

    it('a path parameter with a bad percent-encoding is 400 before anything else happens', async () => {
      expectError(await send({ method: 'DELETE', path: '/v1/users/al%E0%A4%A', peer: admin }), 400, 'GW_ERR_API_BAD_REQUEST', /percent-encoding/);
      expect(calls).toEqual([]);
    });

    it('path parameters are percent-decoded, and the query string takes no part in routing', async () => {
      const removed = await send({ method: 'DELETE', path: '/v1/users/al%69ce?reason=test', peer: admin });
      expect(removed).toMatchObject({ status: 200, body: { removed: 'alice' } });
      expect(await auth.userRoles('alice')).toBeUndefined();
    });

    it('answers are JSON that no cache keeps, with their length', async () => {
      const answer = await send({ method: 'GET', path: '/webapi/ca' });
      expect(answer.status).toBe(200);
      expect(answer.body).toMatchObject({ cluster_name: 'api.example', host_ca: auth.host.tls.certPem });
      expect(answer.headers).toMatchObject({ 'content-type': 'application/json', 'cache-control': 'no-store', 'content-length': Buffer.byteLength(JSON.stringify(answer.body)) });
    });
  });

  describe('error answers', () => {
    it('a failure that is not a GatewayError is a 500 GW_ERR_INTERNAL in the same shape', async () => {
      overrides.publicCas = () => {
        throw new TypeError('something broke');
      };
      expectError(await send({ method: 'GET', path: '/webapi/ca' }), 500, 'GW_ERR_INTERNAL', /something broke/);
    });

    it("a service refusal keeps its code and hint, with the code's status", async () => {
      const answer = await send({ method: 'POST', path: '/webapi/login', body: JSON.stringify({ username: 'alice', password: 'wrong password', public_key: keys.publicKeyPem, ssh_public_key: keys.sshPublicKey }) });
      expectError(answer, 401, 'GW_ERR_AUTH_LOGIN_FAILED', /invalid user name or password/);
    });
  });

  describe('bodies: limits per route, and nesting bounded before parsing', () => {
    it('a declared length over the route limit is 413 without reading a byte', async () => {
      const answer = await send({ method: 'POST', path: '/webapi/login', headers: { 'content-length': String(64 * 1024 + 1) }, end: false });
      expectError(answer, 413, 'GW_ERR_API_TOO_LARGE', /65537 bytes is over this endpoint's 65536/);
      expect(calls).toEqual([]);
    });

    it('an undeclared body is cut off at the route limit (16 KiB for users, 64 KiB for logins)', async () => {
      const big = JSON.stringify({ name: 'bob', roles: ['access'], password: 'x'.repeat(20 * 1024) });
      expectError(await send({ method: 'POST', path: '/v1/users', peer: admin, body: big }), 413, 'GW_ERR_API_TOO_LARGE', /over this endpoint's 16384 bytes/);
      // The same 20 KiB is within a login's limit: read, and refused for what it says instead.
      const login = JSON.stringify({ username: 'alice', password: 'x'.repeat(20 * 1024) });
      expectError(await send({ method: 'POST', path: '/webapi/login', body: login }), 400, 'GW_ERR_API_BAD_REQUEST', /"password" is too long/);
    });

    it('JSON nested deeper than 32 levels is refused before it is parsed; 32 levels are parsed', async () => {
      const nested = (depth: number) => `{"username":${'['.repeat(depth - 1)}${']'.repeat(depth - 1)}}`;
      expectError(await send({ method: 'POST', path: '/webapi/login', body: nested(33) }), 400, 'GW_ERR_API_BAD_REQUEST', /nests deeper than 32 levels/);
      expectError(await send({ method: 'POST', path: '/webapi/login', body: nested(32) }), 400, 'GW_ERR_API_BAD_REQUEST', /"username" must be a string/);
    });

    it('a body must be a JSON object; an empty body is an empty object', async () => {
      expectError(await send({ method: 'POST', path: '/webapi/login', body: '{"username": ' }), 400, 'GW_ERR_API_BAD_REQUEST', /not valid JSON/);
      expectError(await send({ method: 'POST', path: '/webapi/login', body: '["alice"]' }), 400, 'GW_ERR_API_BAD_REQUEST', /must be a JSON object/);
      expectError(await send({ method: 'POST', path: '/webapi/login' }), 400, 'GW_ERR_API_BAD_REQUEST', /"username" must be a string/);
    });

    it('a manifest nested deeper than 96 levels (indentation counted) is refused before the YAML parser runs', async () => {
      overrides.createResources = () => {
        throw new Error('createResources must not be reached');
      };
      const manifest = `${'- '.repeat(49)}x\n`;
      expectError(await send({ method: 'POST', path: '/v1/resources', peer: admin, body: JSON.stringify({ manifest }) }), 400, 'GW_ERR_API_BAD_REQUEST', /manifest nests deeper than 96 levels/);
    });
  });

  describe('POST /v1/resources/apply: bounded before any parse, refused whole', () => {
    beforeEach(() => {
      overrides.applyResources = () => {
        throw new Error('applyResources must not be reached');
      };
    });
    const apply = (body: unknown) => send({ method: 'POST', path: '/v1/resources/apply', peer: admin, body: JSON.stringify(body) });
    const role = 'kind: role\nversion: v7\nmetadata: {name: r}\n';

    it('files must be a non-empty list of { source, manifest }', async () => {
      expectError(await apply({}), 400, 'GW_ERR_API_BAD_REQUEST', /"files" must be a non-empty list/);
      expectError(await apply({ files: [] }), 400, 'GW_ERR_API_BAD_REQUEST', /"files" must be a non-empty list/);
      expectError(await apply({ files: ['x'] }), 400, 'GW_ERR_API_BAD_REQUEST', /must be \{ source, manifest \}/);
      expectError(await apply({ files: [{ source: 'a' }] }), 400, 'GW_ERR_API_BAD_REQUEST', /"manifest" must be a string/);
    });

    it('more than 256 files, or more than 1 MiB together: 413 GW_ERR_APPLY_TOO_LARGE', async () => {
      expectError(await apply({ files: Array.from({ length: 257 }, () => ({ manifest: role })) }), 413, 'GW_ERR_APPLY_TOO_LARGE', /257 files/);
      const half = `${role}# ${'x'.repeat(600 * 1024)}\n`;
      expectError(await apply({ files: [{ manifest: half }, { manifest: half }] }), 413, 'GW_ERR_APPLY_TOO_LARGE', /more than 1048576 characters/);
    });

    it('a manifest nested too deep, a refused document in any file: nothing reaches the Applier', async () => {
      expectError(await apply({ files: [{ manifest: role }, { manifest: `${'- '.repeat(49)}x\n` }] }), 400, 'GW_ERR_API_BAD_REQUEST', /nests deeper than 96 levels/);
      expectError(await apply({ files: [{ source: 'a.yaml', manifest: role }, { source: 'b.yaml', manifest: 'kind: nope\n' }] }), 400, 'GW_ERR_RESOURCE_INVALID', /b\.yaml: document 1: kind: unknown kind "nope"/);
      expectError(await apply({ files: [{ source: 'a.yaml', manifest: role }, { source: 'b.yaml', manifest: role }] }), 400, 'GW_ERR_RESOURCE_INVALID', /role "r" is defined in a\.yaml too/);
    });

    it('a set name that is no label value is refused by the Applier, before it reads anything', async () => {
      delete overrides.applyResources;
      expectError(await apply({ files: [{ manifest: role }], set: 'Not A Label' }), 400, 'GW_ERR_API_BAD_REQUEST', /apply set name "Not A Label"/);
    });
  });

  describe('authenticated routes: the caller, then the route check, then the body', () => {
    /** A request whose body never ends: answered at all only if the router refuses before reading it. */
    const endless = (peer: Request['peer'], path = '/v1/users') => send({ method: 'POST', path, peer, body: '{"name": "mallory", "roles": ["editor"], "password": "', end: false });

    it('no TLS at all, or no client certificate: 401, the body never read', async () => {
      expectError(await endless(undefined), 401, 'GW_ERR_AUTH_UNAUTHENTICATED', /not a TLS connection/);
      expectError(await endless('no certificate'), 401, 'GW_ERR_AUTH_UNAUTHENTICATED', /none was presented/);
      expect(calls).toEqual([]);
    });

    it('a certificate the TLS layer did not verify, or signed by the wrong CA of the cluster: 401', async () => {
      expectError(await endless({ ...alice, authorized: false }), 401, 'GW_ERR_AUTH_UNAUTHENTICATED', /CERT_SIGNATURE_FAILURE/);
      const hostSigned = { ...alice, issuerCertificate: { raw: new X509Certificate(auth.host.tls.certPem).raw } };
      expectError(await endless(hostSigned), 401, 'GW_ERR_AUTH_UNAUTHENTICATED', /must be signed by the user CA/);
      expect(calls).toEqual([]);
    });

    it('a removed user: 401 GW_ERR_AUTH_IDENTITY_REVOKED, the body never read', async () => {
      await auth.removeUser(auth.adminIdentity(), 'alice');
      calls = [];
      expectError(await endless(alice), 401, 'GW_ERR_AUTH_IDENTITY_REVOKED', /no longer exists/);
      expect(calls).toEqual(['resolveCaller']);
    });

    it('a locked user: 403 GW_ERR_ACCESS_LOCKED, the body never read', async () => {
      await auth.createLock(auth.adminIdentity(), { target: { user: 'alice' }, name: 'incident-1' });
      calls = [];
      expectError(await endless(alice), 403, 'GW_ERR_ACCESS_LOCKED', /locked by lock "incident-1"/);
      expect(calls).toEqual(['resolveCaller']);
    });

    it("a caller whose roles do not allow the route's write: 403 from the route's check, the body never read", async () => {
      expectError(await endless(alice), 403, 'GW_ERR_ACCESS_DENIED', /access denied to user "alice"/);
      expect(calls).toEqual(['resolveCaller', 'authorize']);
      calls = [];
      expectError(await endless(alice, '/v1/resources'), 403, 'GW_ERR_ACCESS_DENIED', /none of its roles allows create or update/);
      expect(calls).toEqual(['resolveCaller', 'authorizeAny']);
    });

    it('an allowed caller: its body is read after both checks, then the service runs', async () => {
      const answer = await send({ method: 'POST', path: '/v1/users', peer: admin, body: JSON.stringify({ name: 'bob', roles: ['access'], password: PASSWORD }) });
      expect(answer).toMatchObject({ status: 200, body: { user: { kind: 'user', metadata: { name: 'bob' }, spec: { roles: ['access'] } } } });
      expect(calls).toEqual(['resolveCaller', 'authorize', 'body read', 'addUser']);
    });

    it('a public route reads its body with no caller to resolve', async () => {
      const answer = await send({ method: 'POST', path: '/webapi/login', body: JSON.stringify({ username: 'alice', password: PASSWORD, public_key: keys.publicKeyPem, ssh_public_key: keys.sshPublicKey }) });
      expect(answer.status).toBe(200);
      expect(calls).toEqual(['body read', 'login']);
    });

    it('a route with no body still resolves its caller first', async () => {
      await auth.removeUser(auth.adminIdentity(), 'alice');
      expectError(await send({ method: 'GET', path: '/v1/status', peer: alice }), 401, 'GW_ERR_AUTH_IDENTITY_REVOKED');
      const status = await send({ method: 'GET', path: '/v1/status', peer: admin });
      expect(status).toMatchObject({ status: 200, body: { cluster_name: 'api.example', identity: { kind: 'admin', name: 'admin' } } });
    });
  });
});

describe('the managed rollout routes (src/auth/rollout/)', () => {
  const HOST = '3f1c2b7a-1111-4222-8333-444455556666';
  beforeEach(async () => {
    backend = openSqliteBackend({ path: ':memory:', sweepIntervalMs: 0 });
    auth = await AuthService.open({ backend, clusterName: 'api.example' });
    calls = [];
    overrides = {};
    handler = createApiHandler(observed(auth));
    admin = peerOf(await auth.issueAdminCert(keys.publicKeyPem), auth.user.tls.certPem);
    await auth.addUser(auth.adminIdentity(), 'alice', ['access'], PASSWORD);
    alice = await loginCert('alice');
  });
  afterEach(async () => backend.close());

  it('an instruction is for Proxies (and the local admin) only, with a bounded query', async () => {
    expectError(await send({ method: 'GET', path: `/v1/autoupdate/instruction?host_id=${HOST}`, peer: alice }), 403, 'GW_ERR_ACCESS_DENIED');
    const ok = await send({ method: 'GET', path: `/v1/autoupdate/instruction?host_id=${HOST}&group=dev`, peer: admin });
    expect(ok.status).toBe(200);
    expect(ok.body).toMatchObject({ managed: false, update: false });
    expectError(await send({ method: 'GET', path: '/v1/autoupdate/instruction?host_id=../x', peer: admin }), 400, 'GW_ERR_AUTOUPDATE_QUERY');
  });

  it('commands: refused before the body is read without the right, a bad command or body is 400, no target is 404', async () => {
    expectError(await send({ method: 'POST', path: '/v1/autoupdate/suspend', peer: alice, body: '{}' }), 403, 'GW_ERR_ACCESS_DENIED');
    expect(calls).not.toContain('body read');
    expectError(await send({ method: 'GET', path: '/v1/autoupdate/status', peer: alice }), 403, 'GW_ERR_ACCESS_DENIED');
    expectError(await send({ method: 'POST', path: '/v1/autoupdate/explode', peer: admin, body: '{}' }), 400, 'GW_ERR_API_BAD_REQUEST');
    expectError(await send({ method: 'POST', path: '/v1/autoupdate/rollback', peer: admin, body: '{"now":"yes"}' }), 400, 'GW_ERR_API_BAD_REQUEST');
    expectError(await send({ method: 'POST', path: '/v1/autoupdate/suspend', peer: admin, body: '{}' }), 404, 'GW_ERR_AUTOUPDATE_NOT_CONFIGURED');
    const status = await send({ method: 'GET', path: '/v1/autoupdate/status', peer: admin });
    expect(status.body).toEqual({ managed: false, groups: [] });
  });
});
