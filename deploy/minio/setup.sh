#!/bin/sh
# One-shot MinIO setup (minio/mc image), idempotent: the media bucket, its object-created event to the
# workflow's webhook target (declared on the server by MINIO_NOTIFY_WEBHOOK_*_WORKFLOW, with a queue_dir
# so undelivered events are retried, design §4.4), and the workflow's own access key limited to the bucket.
set -eu
: "${MINIO_ROOT_USER:?}" "${MINIO_ROOT_PASSWORD:?}" "${S3_BUCKET:?}" "${S3_ACCESS_KEY_ID:?}" "${S3_SECRET_ACCESS_KEY:?}"
mc alias set platform http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD"
mc mb --ignore-existing "platform/$S3_BUCKET"
# s3:ObjectCreated:* (put, post, copy, complete multipart) to the target whose ARN the server prints.
# Uploads only (prefix sites/): the copies the workflow makes of accepted uploads (accepted/...) need no event.
mc event add "platform/$S3_BUCKET" arn:minio:sqs::WORKFLOW:webhook --event put --prefix sites/ --ignore-existing
sed "s/platform-media/$S3_BUCKET/g" /setup/media-rw-policy.json > /tmp/media-rw-policy.json
mc admin policy create platform media-rw /tmp/media-rw-policy.json
mc admin user add platform "$S3_ACCESS_KEY_ID" "$S3_SECRET_ACCESS_KEY"
# "attach" fails when the policy is already attached; then confirm it is.
mc admin policy attach platform media-rw --user "$S3_ACCESS_KEY_ID" \
  || mc admin user info platform "$S3_ACCESS_KEY_ID" | grep -q media-rw
mc event list "platform/$S3_BUCKET"
