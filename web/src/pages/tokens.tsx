/**
 * Join tokens: create (types, lifetime, uses), list, revoke. A new token's value is shown once, with the command
 * line `gwctl tokens add` prints for it: the same --proxy, the Proxy's public address from ping (never the host the
 * browser happened to reach the page at: a tunnel, a port forward or another name of the Proxy).
 */
import { useState } from 'preact/hooks';
import { api } from '../api.js';
import { useLoad } from '../components/load.js';
import { Badge, Empty, ErrorBox, Notice, PageHeader, Spinner, TableBox } from '../components/ui.js';
import { clearsData, type ApiError } from '../lib/errors.js';
import { joinCommand } from '../lib/join.js';
import { relative, TOKEN_TTLS, utcStamp } from '../lib/time.js';
import type { CurrentSession, Ping, TokenCreated, TokenRow } from '../types.js';

const TYPES = ['node', 'db', 'app', 'kube', 'desktop', 'proxy'] as const;

export function TokensPage({ session, ping }: { session: CurrentSession; ping: Ping | undefined }) {
  const acl = session.acl?.tokens;
  const { data, error, loading, reload } = useLoad(() => api.tokens());
  const [created, setCreated] = useState<TokenCreated | undefined>(undefined);
  return (
    <>
      <PageHeader title="Join tokens" subtitle="Agents and Proxies join the cluster with a token. Tokens are stored hashed: a value is shown only when it is created.">
        <button type="button" class="btn" onClick={reload} data-testid="tokens-refresh">Refresh</button>
      </PageHeader>
      {acl?.create ? <CreateToken onCreated={(t) => { setCreated(t); reload(); }} /> : null}
      {/* A token shown once goes too when the user is refused (a lock, an expired session): it was theirs to see. */}
      {created && !(error && clearsData(error as Partial<ApiError>)) ? <CreatedToken token={created} proxy={ping?.proxy?.ssh?.public_addr} /> : null}
      <div class="card card-table">
        <ErrorBox error={error} testid="tokens-error" />
        {loading && !data ? <Spinner /> : null}
        {data && data.tokens.length === 0 ? <Empty testid="tokens-empty">No join token.</Empty> : null}
        {data && data.tokens.length > 0 ? <TokenTable rows={data.tokens} canDelete={acl?.delete === true} onRevoked={reload} /> : null}
      </div>
    </>
  );
}

function CreateToken({ onCreated }: { onCreated: (t: TokenCreated) => void }) {
  const [types, setTypes] = useState<string[]>(['node']);
  const [ttl, setTtl] = useState(TOKEN_TTLS[1]!.ms);
  const [uses, setUses] = useState(1);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<Error | undefined>(undefined);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(undefined);
    try {
      onCreated(await api.createToken(types, ttl, uses));
    } catch (err) {
      setError(err as Error);
    } finally {
      setBusy(false);
    }
  };
  const toggle = (t: string) => setTypes((ts) => (ts.includes(t) ? ts.filter((x) => x !== t) : [...ts, t]));
  return (
    <form class="card form form-inline" onSubmit={submit} data-testid="token-form">
      <fieldset class="field">
        <legend>Types</legend>
        <div class="checks">
          {TYPES.map((t) => (
            <label key={t} class="check">
              <input type="checkbox" checked={types.includes(t)} onChange={() => toggle(t)} data-testid={`token-type-${t}`} /> {t}
            </label>
          ))}
        </div>
      </fieldset>
      <label class="field">
        <span>Expires after</span>
        <select value={String(ttl)} onChange={(e) => setTtl(Number(e.currentTarget.value))} data-testid="token-ttl">
          {TOKEN_TTLS.map((o) => <option key={o.ms} value={String(o.ms)}>{o.label}</option>)}
        </select>
      </label>
      <label class="field">
        <span>Uses (0: any number)</span>
        <input type="number" min={0} max={1000} step={1} value={uses} onInput={(e) => setUses(Math.max(0, Math.floor(Number(e.currentTarget.value) || 0)))} data-testid="token-uses" />
      </label>
      <div class="field field-end">
        <button type="submit" class="btn btn-primary" disabled={busy} data-testid="token-create">{busy ? 'Creating…' : 'Create token'}</button>
      </div>
      <ErrorBox error={error} testid="token-error" />
    </form>
  );
}

function CreatedToken({ token, proxy }: { token: TokenCreated; proxy: string | undefined }) {
  const [copied, setCopied] = useState(false);
  const copy = () => navigator.clipboard?.writeText(token.token).then(() => setCopied(true), () => undefined);
  const roles = token.roles.join(',');
  const command = joinCommand(token, proxy);
  return (
    <Notice kind="success" testid="token-created">
      <div>
        Token <code>{token.id}</code> ({roles}) created; it expires {utcStamp(token.expiresAt)}. Copy it now: it is not shown again.
      </div>
      <div class="secret">
        <code data-testid="token-value">{token.token}</code>
        <button type="button" class="btn btn-small" onClick={copy} data-testid="token-copy">{copied ? 'Copied' : 'Copy'}</button>
      </div>
      <div class="muted small">On the agent's machine (the CA pin is printed by <code>gwctl tokens add</code> and by the Proxy at its start):</div>
      <pre class="command" data-testid="token-command">{command}</pre>
    </Notice>
  );
}

function TokenTable({ rows, canDelete, onRevoked }: { rows: TokenRow[]; canDelete: boolean; onRevoked: () => void }) {
  const [error, setError] = useState<Error | undefined>(undefined);
  const [busy, setBusy] = useState<string | undefined>(undefined);
  const now = Date.now();
  const revoke = async (id: string) => {
    if (!window.confirm(`Revoke join token ${id}? An agent that has not joined yet with it can no longer join.`)) return;
    setBusy(id);
    setError(undefined);
    try {
      await api.revokeToken(id);
      onRevoked();
    } catch (e) {
      setError(e as Error);
    } finally {
      setBusy(undefined);
    }
  };
  const sorted = [...rows].sort((a, b) => Date.parse(b.expires) - Date.parse(a.expires));
  return (
    <>
      <ErrorBox error={error} testid="token-revoke-error" />
      <TableBox><table class="table">
        <thead><tr><th>ID</th><th>Types</th><th>Expires</th><th>Uses</th><th>Created by</th><th class="right" /></tr></thead>
        <tbody>
          {sorted.map((t) => {
            const expired = Date.parse(t.expires) <= now;
            return (
              <tr key={t.id} data-testid={`token-row-${t.id}`} class={expired ? 'row-muted' : ''}>
                <td class="mono strong">{t.id}</td>
                <td>{t.roles.map((r) => <Badge kind="neutral" key={r}>{r}</Badge>)}</td>
                <td title={utcStamp(t.expires)}>{expired ? <Badge kind="bad">expired</Badge> : relative(Date.parse(t.expires), now)}</td>
                <td>{t.used} / {t.uses === 0 ? '∞' : t.uses}</td>
                <td>{t.createdBy ?? ''}</td>
                <td class="right">
                  {canDelete ? <button type="button" class="btn btn-danger btn-small" disabled={busy === t.id} onClick={() => void revoke(t.id)} data-testid={`token-revoke-${t.id}`}>Revoke</button> : null}
                </td>
              </tr>
            );
          })}
        </tbody>
      </table></TableBox>
    </>
  );
}
