/** Small pieces every page uses: the error box, label chips, badges, the page header, the box of a table. */
import type { ComponentChildren } from 'preact';
import type { ApiError } from '../lib/errors.js';
import { labelChips } from '../lib/filter.js';

/** The server's message, hint and code of a failure: every failure is shown with all three. */
export function ErrorBox({ error, testid }: { error: ApiError | Error | null | undefined; testid?: string }) {
  if (!error) return null;
  const e = error as Partial<ApiError>;
  return (
    <div class="alert alert-error" role="alert" data-testid={testid ?? 'error'}>
      <div class="alert-message">{error.message}</div>
      {e.hint ? <div class="alert-hint">{e.hint}</div> : null}
      {e.code ? (
        <div class="alert-code">
          <code data-testid={`${testid ?? 'error'}-code`}>{e.code}</code>
          {e.status ? <span class="muted"> · HTTP {e.status}</span> : null}
        </div>
      ) : null}
    </div>
  );
}

export function Notice({ children, testid, kind = 'info' }: { children: ComponentChildren; testid?: string; kind?: 'info' | 'success' | 'warning' }) {
  return (
    <div class={`alert alert-${kind}`} role="status" data-testid={testid}>
      {children}
    </div>
  );
}

export function Chips({ labels, onPick }: { labels: Record<string, string> | undefined; onPick?: (chip: string) => void }) {
  const chips = labelChips(labels);
  if (chips.length === 0) return <span class="muted">—</span>;
  return (
    <span class="chips">
      {chips.map((c) =>
        onPick ? (
          <button type="button" class="chip" title={`Filter by ${c}`} onClick={() => onPick(c)} key={c}>
            {c}
          </button>
        ) : (
          <span class="chip" key={c}>
            {c}
          </span>
        ),
      )}
    </span>
  );
}

export function Badge({ kind, children, testid }: { kind: 'ok' | 'warn' | 'bad' | 'neutral' | 'info'; children: ComponentChildren; testid?: string }) {
  return (
    <span class={`badge badge-${kind}`} data-testid={testid}>
      {children}
    </span>
  );
}

export function PageHeader({ title, subtitle, children }: { title: string; subtitle?: string; children?: ComponentChildren }) {
  return (
    <div class="page-header">
      <div>
        <h1>{title}</h1>
        {subtitle ? <p class="muted">{subtitle}</p> : null}
      </div>
      <div class="page-actions">{children}</div>
    </div>
  );
}

export function Empty({ children, testid }: { children: ComponentChildren; testid?: string }) {
  return (
    <div class="empty" data-testid={testid}>
      {children}
    </div>
  );
}

export function Spinner({ label = 'Loading…' }: { label?: string }) {
  return (
    <div class="loading" data-testid="loading">
      <span class="spinner" aria-hidden="true" />
      {label}
    </div>
  );
}

/** The box of a table: it scrolls sideways when the table is wider than the screen, so that the page never does. */
export function TableBox({ children }: { children: ComponentChildren }) {
  return (
    <div class="table-scroll" data-testid="table-scroll">
      {children}
    </div>
  );
}
