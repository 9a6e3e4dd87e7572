# A permission only: Grant has no table (managed = False).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='Grant',
            fields=[],
            options={
                'managed': False,
                'default_permissions': (),
                'permissions': [('trust_remote_code', "May run a model's own code (model.trust_remote_code)")],
            },
        ),
    ]
