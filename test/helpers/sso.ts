/**
 * Identity providers for the single sign-on tests, real ones started by the test:
 *
 * - an OpenID provider (the `oidc-provider` package) on HTTPS with the test CA, its development login and consent
 *   pages driven with plain HTTP requests (a real browser comes in the browser tests), behind a man in the middle
 *   of the test's own that passes everything through, or rewrites the ID token of the token endpoint's answer
 *   (re-signed with another key, or with the provider's own key after changing aud / iss / nonce / exp);
 * - samlify acting as a SAML identity provider (schema validator @authenio/samlify-node-xmllint), answering our
 *   AuthnRequest well or in one of the ways an attacker would (another key, altered after signing, another
 *   audience or issuer, expired, unsolicited);
 * - a tiny user agent: a cookie jar and requests that never follow redirects, so each hop is seen.
 */
import { createPrivateKey, generateKeyPairSync, randomBytes, sign, type KeyObject } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import * as xmllint from '@authenio/samlify-node-xmllint';
// @ts-expect-error oidc-provider ships no type declarations (a test peer only)
import Provider from 'oidc-provider';
import * as samlify from 'samlify';
import type { TestPki } from './tls.js';

export interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  json: () => Record<string, any>;
  location?: string;
}

/** The error code in a refused answer's JSON body ({ error: { code } }). */
export const answerCode = (a: Answer): string => a.json().error?.code as string;

/** Names only this test's "browser" resolves (as squid's hosts_file does for the gateway): name → IP. */
export const TEST_HOSTS = new Map<string, string>();

/** One request, no redirect followed. */
export function request(url: string, options: { method?: string; headers?: Record<string, string>; body?: string; ca?: string | string[] } = {}): Promise<Answer> {
  const u = new URL(url);
  const mod = u.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const req = mod.request(
      {
        method: options.method ?? 'GET',
        hostname: TEST_HOSTS.get(u.hostname) ?? u.hostname,
        port: u.port,
        path: `${u.pathname}${u.search}`,
        headers: { host: u.host, ...(options.headers ?? {}) },
        ...(options.ca ? { ca: options.ca } : {}),
        agent: false,
        servername: /^[\d.]+$/.test(u.hostname) ? 'localhost' : u.hostname,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString();
          const location = res.headers.location ? new URL(res.headers.location, url).href : undefined;
          resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json: () => JSON.parse(text) as Record<string, any>, ...(location ? { location } : {}) });
        });
      },
    );
    req.on('error', reject);
    req.end(options.body);
  });
}

/** Cookies by host:port (paths ignored: the provider's are all on one host). */
export class CookieJar {
  private readonly jars = new Map<string, Map<string, string>>();

  header(url: string): string {
    return [...(this.jars.get(new URL(url).host) ?? new Map()).entries()].map(([k, v]) => `${k}=${v}`).join('; ');
  }

  store(url: string, answer: Answer): void {
    const host = new URL(url).host;
    const jar = this.jars.get(host) ?? new Map<string, string>();
    this.jars.set(host, jar);
    for (const line of ([] as string[]).concat(answer.headers['set-cookie'] ?? [])) {
      const [pair] = line.split(';');
      const eq = pair!.indexOf('=');
      const name = pair!.slice(0, eq).trim();
      const value = pair!.slice(eq + 1).trim();
      if (/max-age=0\b|expires=Thu, 01 Jan 1970/i.test(line) || value === '') jar.delete(name);
      else jar.set(name, value);
    }
  }

  async send(url: string, options: { method?: string; headers?: Record<string, string>; body?: string; ca?: string | string[] } = {}): Promise<Answer> {
    const cookie = this.header(url);
    const answer = await request(url, { ...options, headers: { ...(options.headers ?? {}), ...(cookie ? { cookie } : {}) } });
    this.store(url, answer);
    return answer;
  }
}

// --- the OpenID provider and the man in the middle -----------------------------------------------------------------

export type TokenTamper = 'none' | 'other-key' | 'aud' | 'iss' | 'nonce' | 'exp';

export interface OidcIdp {
  /** The issuer (the man in the middle's address: everyone reaches the provider through it). */
  issuer: string;
  clientId: string;
  clientSecret: string;
  /** What the man in the middle does to the next token answers. */
  tamper: TokenTamper;
  /** Logs in as user at the provider's pages and consents: from the authorization URL to our callback URL. */
  signIn(authUrl: string, user: string, jar?: CookieJar): Promise<string>;
  close(): Promise<void>;
}

const b64url = (b: Buffer | string) => Buffer.from(b).toString('base64url');

function resign(jwt: string, key: KeyObject, kid: string, change: (claims: Record<string, unknown>) => void): string {
  const [, payload] = jwt.split('.');
  const claims = JSON.parse(Buffer.from(payload!, 'base64url').toString()) as Record<string, unknown>;
  change(claims);
  const head = b64url(JSON.stringify({ alg: 'RS256', kid, typ: 'JWT' }));
  const body = b64url(JSON.stringify(claims));
  return `${head}.${body}.${b64url(sign('sha256', Buffer.from(`${head}.${body}`), key))}`;
}

function tamperToken(text: string, mode: TokenTamper, own: { key: KeyObject; kid: string }, other: KeyObject): string {
  const answer = JSON.parse(text) as { id_token?: string };
  if (!answer.id_token || mode === 'none') return text;
  const id = answer.id_token;
  switch (mode) {
    case 'other-key':
      answer.id_token = resign(id, other, own.kid, () => undefined);
      break;
    case 'aud':
      answer.id_token = resign(id, own.key, own.kid, (c) => void (c.aud = 'someone-else'));
      break;
    case 'iss':
      answer.id_token = resign(id, own.key, own.kid, (c) => void (c.iss = 'https://evil.example'));
      break;
    case 'nonce':
      answer.id_token = resign(id, own.key, own.kid, (c) => void (c.nonce = 'a-nonce-of-another-sign-in'));
      break;
    case 'exp':
      answer.id_token = resign(id, own.key, own.kid, (c) => {
        c.iat = Math.floor(Date.now() / 1000) - 7200;
        c.exp = Math.floor(Date.now() / 1000) - 3600;
      });
      break;
  }
  return JSON.stringify(answer);
}

/**
 * The provider's claims of a user. By the name's prefix: `unverified…` has email_verified false, `silent…` no
 * email_verified claim, `noemail…` no e-mail address at all; everyone has preferred_username (scope profile).
 */
function accountClaims(id: string, groups: string[]): Record<string, unknown> {
  const email = id.startsWith('noemail') ? {} : id.startsWith('silent') ? { email: `${id}@example.com` } : { email: `${id}@example.com`, email_verified: !id.startsWith('unverified') };
  return { sub: id, ...email, preferred_username: id, groups };
}

/**
 * Starts the provider (HTTPS, the test CA's certificate for 127.0.0.1) and the man in the middle in front of it.
 * groups(user) gives the `groups` claim.
 */
export async function startOidcIdp(pki: TestPki, options: { redirectUri: string; groups: (user: string) => string[]; host?: { name: string; ip: string } }): Promise<OidcIdp> {
  const cert = await pki.serverCert({ names: ['localhost', ...(options.host ? [options.host.name] : [])], ips: ['127.0.0.1', ...(options.host ? [options.host.ip] : [])] });
  const tls = { key: cert.keyPem, cert: cert.certPem };
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const other = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey;
  const kid = 'idp-key-1';
  const jwk = { ...privateKey.export({ format: 'jwk' }), kid, use: 'sig', alg: 'RS256' };
  const front = https.createServer(tls);
  await new Promise<void>((r) => front.listen(0, options.host?.ip ?? '127.0.0.1', r));
  const issuer = `https://${options.host?.name ?? '127.0.0.1'}:${(front.address() as AddressInfo).port}`;
  if (options.host) TEST_HOSTS.set(options.host.name, options.host.ip);
  const clientId = 'gateway';
  const clientSecret = randomBytes(16).toString('hex');
  const provider = new Provider(issuer, {
    clients: [{ client_id: clientId, client_secret: clientSecret, redirect_uris: [options.redirectUri], response_types: ['code'], grant_types: ['authorization_code'], token_endpoint_auth_method: 'client_secret_basic' }],
    findAccount: async (_ctx: unknown, id: string) => ({ accountId: id, claims: async () => accountClaims(id, options.groups(id)) }),
    claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['preferred_username'], groups: ['groups'] },
    scopes: ['openid', 'email', 'groups', 'profile'],
    jwks: { keys: [jwk] },
    cookies: { keys: [randomBytes(16).toString('hex')] },
    features: { devInteractions: { enabled: true } },
    conformIdTokenClaims: false,
  } as never);
  provider.on('server_error', () => undefined);
  const back = https.createServer(tls, provider.callback());
  await new Promise<void>((r) => back.listen(0, '127.0.0.1', r));
  const backPort = (back.address() as AddressInfo).port;
  const idp: OidcIdp = {
    issuer, clientId, clientSecret, tamper: 'none',
    signIn: (authUrl, user, jar = new CookieJar()) => driveProvider(jar, authUrl, user, pki.caPem, issuer),
    close: async () => {
      await new Promise<void>((r) => front.close(() => r()));
      await new Promise<void>((r) => back.close(() => r()));
    },
  };
  const own = { key: createPrivateKey(privateKey.export({ format: 'pem', type: 'pkcs8' })), kid };
  front.on('request', (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const up = https.request({ host: '127.0.0.1', port: backPort, method: req.method, path: req.url, headers: req.headers, ca: pki.caPem, servername: 'localhost' }, (answer) => {
        const body: Buffer[] = [];
        answer.on('data', (c: Buffer) => body.push(c));
        answer.on('end', () => {
          let text = Buffer.concat(body);
          if (req.url?.startsWith('/token') && answer.statusCode === 200) text = Buffer.from(tamperToken(text.toString(), idp.tamper, own, other));
          const headers = { ...answer.headers, 'content-length': String(text.length) };
          delete headers['transfer-encoding'];
          res.writeHead(answer.statusCode ?? 502, headers);
          res.end(text);
        });
      });
      up.on('error', () => res.destroy());
      up.end(Buffer.concat(chunks));
    });
  });
  return idp;
}

/** From the authorization URL through login and consent to the Location of our callback. */
async function driveProvider(jar: CookieJar, authUrl: string, user: string, ca: string, issuer: string): Promise<string> {
  let url = authUrl;
  for (let hop = 0; hop < 20; hop++) {
    if (!url.startsWith(issuer)) return url;
    const page = await jar.send(url, { ca });
    if (page.location) {
      url = page.location;
      continue;
    }
    if (page.status !== 200) throw new Error(`the provider answered ${page.status} at ${url}: ${page.text.slice(0, 300)}`);
    const prompt = /name="prompt" value="(\w+)"/.exec(page.text)?.[1];
    const body = prompt === 'login' ? new URLSearchParams({ prompt, login: user, password: 'any' }) : new URLSearchParams({ prompt: prompt ?? 'consent' });
    const posted = await jar.send(url, { method: 'POST', ca, headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: body.toString() });
    if (!posted.location) throw new Error(`the provider answered ${posted.status} to the ${prompt} form: ${posted.text.slice(0, 300)}`);
    url = posted.location;
  }
  throw new Error('too many redirects at the provider');
}

// --- the SAML identity provider ------------------------------------------------------------------------------------

export interface SamlAnswer {
  SAMLResponse: string;
  RelayState: string;
}

/** How the identity provider's answer departs from a good one, for the hostile tests. */
export interface SamlTamper {
  /** Signed by a key that is not in the metadata. */
  otherKey?: boolean;
  audience?: string;
  issuer?: string;
  /** The assertion's time window moved this many ms (negative: expired). */
  shiftMs?: number;
  /** No InResponseTo at all (an unsolicited response). */
  unsolicited?: boolean;
  /** Applied to the signed XML (altered after signing). */
  alter?: (xml: string) => string;
}

export interface SamlIdp {
  /** The identity provider's metadata XML (entity_descriptor of the connector). */
  metadata: string;
  entityId: string;
  /** What the identity provider answers, after its login page, to the AuthnRequest in authUrl. */
  respond(authUrl: string, user: string, groups: string[], tamper?: SamlTamper): Promise<SamlAnswer>;
}

export function rsaKeyPair(dir: string, name: string): { key: string; cert: string } {
  const keyPath = `${dir}/${name}.key`;
  const certPath = `${dir}/${name}.crt`;
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-subj', `/CN=${name}`, '-days', '2', '-keyout', keyPath, '-out', certPath], { stdio: 'ignore' });
  return { key: readFileSync(keyPath, 'utf8'), cert: readFileSync(certPath, 'utf8') };
}

const SAML_SSO_URL = 'https://idp.example/sso';

/**
 * samlify acting as the identity provider (its schema validator: @authenio/samlify-node-xmllint), with an RSA
 * key of its own and another one for forged answers. Its login page is not served: respond() is what it answers
 * once the user has signed in there.
 */
export async function startSamlIdp(dir: string, sp: { entityId: string; acs: string }): Promise<SamlIdp> {
  samlify.setSchemaValidator(xmllint);
  const own = rsaKeyPair(dir, 'saml-idp');
  const forger = rsaKeyPair(dir, 'saml-forger');
  const entityId = 'https://idp.example/metadata';
  const make = (k: { key: string; cert: string }) =>
    samlify.IdentityProvider({
      entityID: entityId,
      privateKey: k.key,
      signingCert: k.cert,
      wantAuthnRequestsSigned: false,
      nameIDFormat: ['urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified'],
      singleSignOnService: [{ Binding: samlify.Constants.namespace.binding.redirect, Location: SAML_SSO_URL }],
    });
  const idp = make(own);
  const forged = make(forger);
  const provider = samlify.ServiceProvider({
    entityID: sp.entityId,
    assertionConsumerService: [{ Binding: samlify.Constants.namespace.binding.post, Location: sp.acs }],
    wantAssertionsSigned: true,
  });
  const respond = async (authUrl: string, user: string, groups: string[], tamper: SamlTamper = {}): Promise<SamlAnswer> => {
    const url = new URL(authUrl);
    const query = Object.fromEntries(url.searchParams);
    const { extract } = await idp.parseLoginRequest(provider, 'redirect', { query, octetString: url.search.slice(1) });
    const now = Date.now() + (tamper.shiftMs ?? 0);
    const iso = (ms: number) => new Date(ms).toISOString();
    const attributes = `<saml:AttributeStatement><saml:Attribute Name="groups">${groups.map((g) => `<saml:AttributeValue xsi:type="xs:string">${g}</saml:AttributeValue>`).join('')}</saml:Attribute></saml:AttributeStatement>`;
    const signer = tamper.otherKey ? forged : idp;
    const { context } = await signer.createLoginResponse(provider, { extract }, 'post', { email: user }, (template: string) => {
      const values = {
        ID: `_${randomBytes(16).toString('hex')}`,
        AssertionID: `_${randomBytes(16).toString('hex')}`,
        Destination: sp.acs,
        Audience: tamper.audience ?? sp.entityId,
        SubjectRecipient: sp.acs,
        Issuer: tamper.issuer ?? entityId,
        IssueInstant: iso(now),
        StatusCode: 'urn:oasis:names:tc:SAML:2.0:status:Success',
        ConditionsNotBefore: iso(now - 60_000),
        ConditionsNotOnOrAfter: iso(now + 5 * 60_000),
        SubjectConfirmationDataNotOnOrAfter: iso(now + 5 * 60_000),
        NameIDFormat: 'urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified',
        NameID: user,
        InResponseTo: tamper.unsolicited ? undefined : (extract.request?.id as string),
      };
      const withAttributes = template.replace('{AttributeStatement}', attributes).replace('{AuthnStatement}', '');
      return { id: values.ID, context: samlify.SamlLib.replaceTagsByValue(withAttributes, values as never) };
    });
    let xml = Buffer.from(context, 'base64').toString();
    if (tamper.alter) xml = tamper.alter(xml);
    return { SAMLResponse: Buffer.from(xml).toString('base64'), RelayState: query.RelayState ?? '' };
  };
  return { metadata: idp.getMetadata(), entityId, respond };
}
