// The test page's uploader, bundled by esbuild for the browser (test/browser-upload.test.ts): Uppy's
// @uppy/aws-s3 plugin driven by the workflow's upload endpoints, as the portal would. The page is served
// from the portal origin, which forwards /api/ to the workflow service, so only the store needs CORS.
import AwsS3 from '@uppy/aws-s3';
import type { AwsS3Part } from '@uppy/aws-s3';
import Uppy from '@uppy/core';

interface Plan {
  upload_id: string;
  part_size_bytes: number;
  part_count: number;
}
interface IntentAnswer {
  media_id: string;
  upload?: { method: 'PUT'; url: string; headers: Record<string, string> };
  multipart?: Plan;
}
/** What survives a reload: enough to resume the upload in parts of the same file. */
interface Saved {
  mediaId: string;
  uploadId: string;
  partSizeBytes: number;
}
export interface UploadOutcome {
  mediaId: string;
  multipart: boolean;
}

declare global {
  interface Window {
    uploadSelected(): Promise<UploadOutcome>;
    resumeSelected(): Promise<UploadOutcome>;
  }
}

const params = new URLSearchParams(location.search);
const token = params.get('token') ?? '';
const siteId = params.get('site') ?? '';
const STORAGE_KEY = 'multipart-upload';

async function api<T>(method: string, path: string, body?: unknown): Promise<T> {
  const res = await fetch(`/api/sites/${siteId}/media${path}`, {
    method,
    headers: {
      Authorization: `Bearer ${token}`,
      ...(body === undefined ? {} : { 'Content-Type': 'application/json' }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`);
  return (res.status === 204 ? undefined : await res.json()) as T;
}

function selected(): File {
  const input = document.querySelector<HTMLInputElement>('#file');
  const file = input?.files?.[0];
  if (file === undefined) throw new Error('no file selected');
  return file;
}

/** One Uppy instance per upload: the answer of the file's intent decides single PUT or parts. */
function uploader(intent: IntentAnswer, saved: Saved | undefined): Uppy {
  const mediaId = intent.media_id;
  const uppy = new Uppy({ autoProceed: false });
  uppy.use(AwsS3, {
    shouldUseMultipart: () => intent.multipart !== undefined || saved !== undefined,
    getChunkSize: () => saved?.partSizeBytes ?? intent.multipart?.part_size_bytes ?? 5 * 1024 * 1024,
    // Uppy's own default is up to six parts at once (the browser's per-host connection limit).
    limit: 4,
    getUploadParameters: () => {
      if (intent.upload === undefined) throw new Error('the intent has no single upload URL');
      return { method: 'PUT', url: intent.upload.url, headers: intent.upload.headers };
    },
    createMultipartUpload: () => {
      if (intent.multipart === undefined) throw new Error('the intent has no plan of parts');
      const state: Saved = {
        mediaId,
        uploadId: intent.multipart.upload_id,
        partSizeBytes: intent.multipart.part_size_bytes,
      };
      localStorage.setItem(STORAGE_KEY, JSON.stringify(state));
      return { uploadId: state.uploadId, key: mediaId };
    },
    signPart: async (_file, { key, partNumber }) => {
      const answer = await api<{ parts: Array<{ url: string; headers: Record<string, string> }> }>(
        'POST',
        `/${key}/multipart/part-urls`,
        { parts: [{ part_number: partNumber }] },
      );
      const part = answer.parts[0];
      if (part === undefined) throw new Error('no part URL');
      return { method: 'PUT', url: part.url, headers: part.headers };
    },
    listParts: async (_file, { key }) => {
      const answer = await api<{ parts: Array<{ part_number: number; size_bytes: number; etag: string }> }>(
        'GET',
        `/${key}/multipart/parts`,
      );
      return answer.parts.map((p): AwsS3Part => ({
        PartNumber: p.part_number,
        Size: p.size_bytes,
        ETag: p.etag,
      }));
    },
    completeMultipartUpload: async (_file, { key, parts }) => {
      await api('POST', `/${key}/multipart/complete`, {
        parts: parts.map((p) => ({ part_number: p.PartNumber, etag: p.ETag })),
      });
      localStorage.removeItem(STORAGE_KEY);
      return { location: `/api/sites/${siteId}/media/${key}/download` };
    },
    abortMultipartUpload: async (_file, { key }) => {
      await api('DELETE', `/${key}/multipart`);
    },
  });
  return uppy;
}

async function run(uppy: Uppy, file: File, saved: Saved | undefined): Promise<void> {
  const id = uppy.addFile({ name: file.name, type: file.type, data: file });
  // A restored upload: the plugin asks the store which parts it holds (listParts) and sends the rest.
  // (@uppy/aws-s3 5 keeps this state on the file without declaring it on UppyFile.)
  if (saved !== undefined) {
    const restored: Record<string, unknown> = {
      s3Multipart: { uploadId: saved.uploadId, key: saved.mediaId },
    };
    uppy.setFileState(id, restored);
  }
  const result = await uppy.upload();
  const failed = result?.failed ?? [];
  if (failed.length > 0) throw new Error(`upload failed: ${String(failed[0]?.error)}`);
}

window.uploadSelected = async () => {
  const file = selected();
  const intent = await api<IntentAnswer>('POST', '/upload-intents', {
    filename: file.name,
    content_type: file.type,
    size_bytes: file.size,
  });
  await run(uploader(intent, undefined), file, undefined);
  return { mediaId: intent.media_id, multipart: intent.multipart !== undefined };
};

window.resumeSelected = async () => {
  const raw = localStorage.getItem(STORAGE_KEY);
  if (raw === null) throw new Error('nothing to resume');
  const saved = JSON.parse(raw) as Saved;
  await run(uploader({ media_id: saved.mediaId }, saved), selected(), saved);
  return { mediaId: saved.mediaId, multipart: true };
};
