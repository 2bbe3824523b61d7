/**
 * The single sign-on routes (public: no client certificate), served by the Auth API router (api.ts) and so by
 * the Proxy's web port, in process or forwarded:
 *
 *   GET  /webapi/connectors                           the connectors to offer, and the default
 *   GET  /webapi/sso/:kind/:name/login?redirect=/p    302 to the identity provider (+ the browser-binding cookie)
 *   GET  /webapi/sso/oidc/callback                    the providers come back here: web mode sets the session
 *   POST /webapi/sso/saml/acs                         cookie and 302s to /web/sso-complete; console mode 302s to
 *   GET  /webapi/sso/github/callback                  gwsh's http://127.0.0.1:<port>/callback?code=...
 *   POST /webapi/sso/console                          gwsh login --auth: {auth_url, request_id}
 *   POST /webapi/sso/console/exchange                 gwsh: the one-time code and its secret → certificates
 *
 * A callback that fails answers a browser (Accept: text/html) with a small page naming the error and a link back
 * to the login page; anything else gets the JSON error of every route.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { GatewayError, httpStatus, toGatewayError } from '../errors.js';
import { escapeHtml, readBoundedBody } from '../net/http.js';
import { STREAMED } from './proxyapi.js';
import { cookieValue } from './websessions.js';
import type { AuthService } from './service.js';
import { MAX_SAML_RESPONSE, SSO_KINDS, type SsoKind } from './sso/index.js';

/** The sign-in's browser binding (the session's own cookie is websessions.ts's). */
export const BINDING_COOKIE = '__Host-gw_sso';
const BINDING_MAX_AGE_S = 600;
/**
 * The SAML ACS: the identity provider's page POSTs the browser here cross-site, so its Origin is the provider's
 * (or "null"): api.ts does not apply its Origin check to it. The state, the browser-binding cookie and the signed,
 * audience-bound response answering our request are its protection.
 */
export const SAML_ACS_PATH = '/webapi/sso/saml/acs';
/** Where the page picks up its bearer after a web sign-in. */
export const SSO_COMPLETE_PATH = '/web/sso-complete';

export interface SsoCtx {
  req: IncomingMessage;
  res: ServerResponse;
  params: Record<string, string>;
  query: URLSearchParams;
  body: () => Promise<Record<string, unknown>>;
  source: string;
}

export interface SsoRoute {
  method: string;
  path: string;
  maxBody: number;
  handler: (ctx: SsoCtx) => Promise<unknown>;
}


function wantsHtml(req: IncomingMessage): boolean {
  return /\btext\/html\b/.test(req.headers.accept ?? '');
}

const bindingCookie = (value: string, maxAge: number) => `${BINDING_COOKIE}=${value}; Path=/; HttpOnly; Secure; SameSite=None; Max-Age=${maxAge}`;

function redirect(res: ServerResponse, location: string, cookies: string[] = []): typeof STREAMED {
  res.writeHead(302, { location, 'cache-control': 'no-store', 'referrer-policy': 'no-referrer', 'content-length': 0, ...(cookies.length ? { 'set-cookie': cookies } : {}) });
  res.end();
  return STREAMED;
}

/** A browser's error page: the code, the message and the hint, and the way back to the login page. */
function errorPage(res: ServerResponse, err: unknown): typeof STREAMED {
  const e = toGatewayError(err);
  const { code, message, hint } = e.toJSON();
  const html = `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Sign-in failed</title></head><body data-testid="sso-error">` +
    `<h1>Sign-in failed</h1><p data-testid="sso-error-message">${escapeHtml(message)}</p><p>${escapeHtml(hint ?? '')}</p>` +
    `<p><code data-testid="sso-error-code">${escapeHtml(code)}</code></p><p><a href="/web/login">Back to the login page</a></p></body></html>`;
  res.writeHead(httpStatus(code), {
    'content-type': 'text/html; charset=utf-8',
    'cache-control': 'no-store',
    'content-security-policy': "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    'x-content-type-options': 'nosniff',
    'set-cookie': bindingCookie('', 0),
    'content-length': Buffer.byteLength(html),
  });
  res.end(html);
  return STREAMED;
}

/** Runs a browser-facing step: its errors become the error page for a browser, JSON errors otherwise. */
async function browser(ctx: SsoCtx, step: () => Promise<typeof STREAMED>): Promise<unknown> {
  try {
    return await step();
  } catch (err) {
    if (wantsHtml(ctx.req)) return errorPage(ctx.res, err);
    throw err;
  }
}

function kindOf(value: string | undefined): SsoKind {
  if (!SSO_KINDS.includes(value as SsoKind)) {
    throw new GatewayError('GW_ERR_SSO_CONNECTOR_UNKNOWN', `"${String(value).slice(0, 64)}" is not a kind of connector (oidc, saml, github)`);
  }
  return value as SsoKind;
}

/** The ACS's form body (application/x-www-form-urlencoded), bounded. */
async function formBody(req: IncomingMessage, max: number): Promise<URLSearchParams> {
  return new URLSearchParams((await readBoundedBody(req, max)).toString('utf8'));
}

function str(b: Record<string, unknown>, key: string, max: number): string {
  const v = b[key];
  if (typeof v !== 'string' || v === '') throw new GatewayError('GW_ERR_API_BAD_REQUEST', `"${key}" must be a non-empty string`);
  if (v.length > max) throw new GatewayError('GW_ERR_API_BAD_REQUEST', `"${key}" is too long`);
  return v;
}

/**
 * A sign-in starts in a page the browser opens (Sec-Fetch-Dest: document), never as an image, frame or fetch that
 * some other page makes it load: those would use up the starts of the browser's address (30 a minute) without
 * anyone signing in. Clients that send no Sec-Fetch-Dest (not a browser) are not concerned.
 */
function notSubresource(req: IncomingMessage): void {
  const dest = req.headers['sec-fetch-dest'];
  if (dest !== undefined && dest !== 'document') {
    throw new GatewayError('GW_ERR_API_BAD_REQUEST', `a sign-in starts in a page of its own, not as a${/^[aeiou]/.test(String(dest)) ? 'n' : ''} ${String(dest).slice(0, 32)} of another page`, {
      hint: "Open the sign-in link in the browser's window (the login page's buttons do).",
    });
  }
}

/** A callback's common end: web → session cookie and /web/sso-complete; console → gwsh's loopback URL. */
async function finish(auth: AuthService, ctx: SsoCtx, kind: SsoKind, callback: { state: string | null; query?: URLSearchParams; samlResponse?: string }): Promise<typeof STREAMED> {
  const browserBinding = cookieValue(ctx.req.headers.cookie, BINDING_COOKIE);
  const result = await auth.sso.finish(kind, { ...callback, ...(browserBinding ? { browserBinding } : {}), source: ctx.source });
  if (result.mode === 'console') return redirect(ctx.res, result.location, [bindingCookie('', 0)]);
  return redirect(ctx.res, `${SSO_COMPLETE_PATH}?redirect=${encodeURIComponent(result.redirect)}`, [result.session.cookie, bindingCookie('', 0)]);
}

export function ssoRoutes(auth: AuthService): SsoRoute[] {
  const none = 0;
  return [
    { method: 'GET', path: '/webapi/connectors', maxBody: none, handler: () => auth.sso.connectors() },
    {
      method: 'GET', path: '/webapi/sso/:kind/:name/login', maxBody: none, handler: (ctx) => browser(ctx, async () => {
        notSubresource(ctx.req);
        const started = await auth.sso.startWeb(kindOf(ctx.params.kind), ctx.params.name!, ctx.query.get('redirect'), ctx.source);
        return redirect(ctx.res, started.url, [bindingCookie(started.binding, BINDING_MAX_AGE_S)]);
      }),
    },
    {
      method: 'GET', path: '/webapi/sso/oidc/callback', maxBody: none,
      handler: (ctx) => browser(ctx, () => finish(auth, ctx, 'oidc', { state: ctx.query.get('state'), query: ctx.query })),
    },
    {
      method: 'GET', path: '/webapi/sso/github/callback', maxBody: none,
      handler: (ctx) => browser(ctx, () => finish(auth, ctx, 'github', { state: ctx.query.get('state'), query: ctx.query })),
    },
    {
      method: 'POST', path: SAML_ACS_PATH, maxBody: MAX_SAML_RESPONSE + 4096, handler: (ctx) => browser(ctx, async () => {
        const form = await formBody(ctx.req, MAX_SAML_RESPONSE + 4 * 1024);
        const samlResponse = form.get('SAMLResponse') ?? undefined;
        return finish(auth, ctx, 'saml', { state: form.get('RelayState'), ...(samlResponse ? { samlResponse } : {}) });
      }),
    },
    {
      method: 'POST', path: '/webapi/sso/console', maxBody: 64 * 1024, handler: async (ctx) => {
        const b = await ctx.body();
        return auth.sso.startConsole(str(b, 'connector', 256), {
          publicKeyPem: str(b, 'public_key', 16_384),
          sshPublicKey: str(b, 'ssh_public_key', 16_384),
          redirectUrl: str(b, 'redirect_url', 256),
          secretHash: str(b, 'secret_hash', 64),
        }, ctx.source);
      },
    },
    {
      method: 'POST', path: '/webapi/sso/console/exchange', maxBody: 16 * 1024, handler: async (ctx) => {
        const b = await ctx.body();
        return auth.sso.exchange(str(b, 'request_id', 128), str(b, 'code', 128), str(b, 'secret', 128), ctx.source);
      },
    },
  ];
}
